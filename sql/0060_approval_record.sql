-- 0060_approval_record.sql -- what an approval approved (docs/security.md).
--
-- The approval digest is the lowercase hex SHA-256 of the UTF-8 text of
-- qtg_approval_document(request): PostgreSQL's own jsonb text of the fields
-- that decide what a request moves.  jsonb text is deterministic for a stored
-- value (keys sorted, one spacing), so the daemon, the approval policy and the
-- separate signer process compute the same digest from the same row using
-- only PostgreSQL's built-ins.  The signer inlines the same expression in its
-- own SQL rather than calling these functions, so a role able to replace a
-- function cannot change what the signer checks.
CREATE FUNCTION qtg_approval_document(r movement_requests) RETURNS jsonb
  LANGUAGE sql IMMUTABLE AS $$
  SELECT jsonb_build_object(
    'template_key', r.template_key,
    'plan_version_id', r.plan_version_id,
    'compiled_plan_hash', r.compiled_plan_hash,
    'intent', r.intent,
    'input_params', r.input_params,
    'network_class', r.network_class,
    'callback_url', r.callback_url)
$$;

CREATE FUNCTION qtg_approval_digest(r movement_requests) RETURNS text
  LANGUAGE sql IMMUTABLE AS $$
  SELECT encode(sha256(convert_to(qtg_approval_document(r)::text, 'UTF8')), 'hex')
$$;

-- approval_digest: the digest the approvals were given for (NULL before the
-- first approval).  approvals_required: the quorum the approval policy asked
-- for (0 when the policy itself allowed the request).  approval_policy: the
-- matched rule and its inputs, as the policy recorded them.
ALTER TABLE movement_requests
  ADD COLUMN approval_digest text CHECK (approval_digest ~ '^[0-9a-f]{64}$'),
  ADD COLUMN approvals_required int NOT NULL DEFAULT 1 CHECK (approvals_required >= 0),
  ADD COLUMN approval_policy jsonb;

-- One decision per (request, principal).  principal is the actor string
-- (operator:NAME, api:NAME, policy:RULE, console:UID for an unmapped uid).
CREATE TABLE request_approvals (
  id               bigserial PRIMARY KEY,
  request_id       uuid NOT NULL REFERENCES movement_requests(id),
  principal        text NOT NULL CHECK (principal <> ''),
  decision         text NOT NULL CHECK (decision IN ('approve', 'reject')),
  comment          text,
  approval_digest  text NOT NULL CHECK (approval_digest ~ '^[0-9a-f]{64}$'),
  created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  UNIQUE (request_id, principal)
);
