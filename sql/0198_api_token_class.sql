-- 0198_api_token_class.sql -- an API token serves one network class
-- (docs/api.md "Authentication and roles").
--
-- Daemons of several network classes may share one database (qtgd@NAME,
-- docs/operations.md "Several instances"), and a token was looked up by its
-- hash alone: one made for a test class created and approved requests on
-- the production class's daemon.  `qtgd tokens create` now binds each token
-- to one class (its MG_NETWORK_CLASS, or --class), and a daemon of another
-- class answers it 401.  A token made before this migration has no class
-- and keeps reaching every class, as it did; `qtgd tokens list` shows it
-- as "(every class)": replace it with one per class.
ALTER TABLE api_tokens
  ADD COLUMN network_class text CHECK (network_class ~ '^[a-z0-9_-]{1,32}$');
