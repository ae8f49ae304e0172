# spec/env.sh -- the settings every run of the Lua specs assumes, sourced by
# each runner of them (tools/test's busted step, tools/chaos.d/memcheck), so a
# run under valgrind sees what a plain run sees.  A value already set wins.
#
# Specs make throwaway network classes of every name: sim may run on all of
# them (spec/lua/engine/sim_classes_spec.lua sets a real list and checks refusals).
export MG_SIM_NETWORK_CLASSES="${MG_SIM_NETWORK_CLASSES:-*}"
# The specs drive nodes with executors answering retry_after_seconds = 0 and
# expect the next pass to observe them: the observe floor is off for them
# (spec/lua/engine/pacing_spec.lua runs its daemons with it on).
export MG_NODE_OBSERVE_MIN_INTERVAL_SECONDS="${MG_NODE_OBSERVE_MIN_INTERVAL_SECONDS:-0}"
