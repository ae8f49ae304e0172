-- 0204_signer_reads_plan_edges.sql -- qtgd signer reads the plan's edges:
-- it signs a transfer only once every step right before it in the sealed
-- plan is COMPLETED or SKIPPED, as the engine readies a node
-- (src/qtg_signerd.c, STEPS_BEFORE_NOT_DONE; docs/security.md section 6).
-- The runtime role writes node states and could make a transfer READY
-- ahead of a manual gate; plan_edges are sealed with their plan version
-- (0170), so the order the signer reads is the one in place when the
-- request was made.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'qtg_signer') THEN
    GRANT SELECT ON plan_edges TO qtg_signer;
  ELSE
    RAISE NOTICE 'role qtg_signer does not exist: after creating it, GRANT SELECT ON plan_edges TO qtg_signer';
  END IF;
END $$;
