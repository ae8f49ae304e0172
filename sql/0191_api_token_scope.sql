-- 0191_api_token_scope.sql -- a token that sees and acts on its own
-- requests only (docs/api.md "Authentication and roles").
--
-- A token's roles apply to its whole network class; several client systems
-- sharing a class could read and cancel each other's requests.  A token of
-- scope 'own' reaches only the requests its own client created (created_by
-- = 'api:' || name): their details, events, nodes and callbacks; lists are
-- filtered to them, anything else is "not found", and the routes about the
-- whole class (balances, signers, workers, heartbeats, readiness, metrics)
-- are refused.  Such a token holds read and operate only: approving needs
-- other clients' requests (its own it may never approve), admin is
-- everything.
ALTER TABLE api_tokens
  ADD COLUMN scope text NOT NULL DEFAULT 'class' CHECK (scope IN ('class', 'own')),
  ADD CONSTRAINT api_tokens_own_scope_roles
    CHECK (scope = 'class' OR roles <@ ARRAY['read', 'operate']::text[]);
