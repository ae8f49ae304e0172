/* qtg_modules.h -- the host's subsystems and Lua modules, in start order.
 * One row each, so adding a subsystem never touches the host's code.
 *
 * QTG_SUBSYSTEM(name, open, close, phase): int open(qtg_host*, char *err,
 *   size_t errlen) returns 0 or -1 with a message; void close(qtg_host*)
 *   frees what open made (it may close uv handles: the host runs the loop
 *   afterwards so close callbacks complete).  Closed in reverse order.
 *   phase QTG_CLOSE_BEFORE_LUA: closed while the Lua state still exists (it
 *   may touch Lua); QTG_CLOSE_AFTER_LUA: closed after lua_close, so it must
 *   never resume a task or touch Lua -- in-flight I/O is dropped silently.
 * QTG_LUA_MODULE(field, opener): int opener(lua_State*) pushes one table that
 *   becomes qtg.<field>.
 */
#ifdef QTG_SUBSYSTEM
QTG_SUBSYSTEM(keys, qtg_keys_open, qtg_keys_close, QTG_CLOSE_AFTER_LUA)
QTG_SUBSYSTEM(pg, qtg_pg_open, qtg_pg_close, QTG_CLOSE_AFTER_LUA)
QTG_SUBSYSTEM(http, qtg_http_open, qtg_http_close, QTG_CLOSE_AFTER_LUA)
QTG_SUBSYSTEM(signer, qtg_signer_client_open, qtg_signer_client_close, QTG_CLOSE_AFTER_LUA)
QTG_SUBSYSTEM(api_net, qtg_api_net_open, qtg_api_net_close, QTG_CLOSE_BEFORE_LUA)
QTG_SUBSYSTEM(runtime, qtg_runtime_open, qtg_runtime_close, QTG_CLOSE_BEFORE_LUA)
QTG_SUBSYSTEM(console, qtg_console_open, qtg_console_close, QTG_CLOSE_BEFORE_LUA)
QTG_SUBSYSTEM(api, qtg_api_open, qtg_api_close, QTG_CLOSE_BEFORE_LUA)
QTG_SUBSYSTEM(watchdog, qtg_watchdog_open, qtg_watchdog_close, QTG_CLOSE_AFTER_LUA)
#endif

#ifdef QTG_LUA_MODULE
QTG_LUA_MODULE("log", luaopen_qtg_log)
QTG_LUA_MODULE("db", luaopen_qtg_db)
QTG_LUA_MODULE("runtime", luaopen_qtg_runtime)
QTG_LUA_MODULE("http", luaopen_qtg_http)
QTG_LUA_MODULE("crypto", luaopen_qtg_crypto)
QTG_LUA_MODULE("approvers", luaopen_qtg_approvers)
QTG_LUA_MODULE("signer", luaopen_qtg_signer)
QTG_LUA_MODULE("evm", luaopen_qtg_evm)
QTG_LUA_MODULE("console_server", luaopen_qtg_console_server)
QTG_LUA_MODULE("api_server", luaopen_qtg_api_server)
QTG_LUA_MODULE("api_keys", luaopen_qtg_api_keys)
QTG_LUA_MODULE("api_net", luaopen_qtg_api_net)
QTG_LUA_MODULE("systemd", luaopen_qtg_systemd)
#endif
