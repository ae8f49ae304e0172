-- 0022_capital_transfer_requests.sql -- capital transfers between venues
-- (issue 5; followed up by capital_transfer_followup;
-- docs/conditional-workers.md section 3).
--
-- A capital transfer is an operator's request to move capital from one venue
-- to another, carried out by a movement request (movement_request_id).
-- status: pending (waiting for its movement), completed / failed (settled
-- from the movement's terminal state), surfaced (stale with no movement, or
-- its movement stuck: operators are told once), cancelled (by an operator).
CREATE TABLE capital_transfer_requests (
  id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  network_class        text NOT NULL CHECK (network_class <> ''),
  from_venue           text NOT NULL CHECK (from_venue <> ''),
  to_venue             text NOT NULL CHECK (to_venue <> ''),
  asset                text NOT NULL CHECK (asset <> ''),
  amount               numeric NOT NULL CHECK (amount > 0),
  movement_request_id  uuid REFERENCES movement_requests(id),
  status               text NOT NULL DEFAULT 'pending'
                       CHECK (status IN ('pending', 'completed', 'failed', 'surfaced', 'cancelled')),
  status_reason        text,
  followups            int NOT NULL DEFAULT 0 CHECK (followups >= 0),
  last_followup_at     timestamptz,
  surfaced_at          timestamptz,
  settled_at           timestamptz,
  created_by           text NOT NULL,
  created_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
  CHECK ((status IN ('completed', 'failed')) = (settled_at IS NOT NULL)),
  CHECK (status <> 'surfaced' OR surfaced_at IS NOT NULL)
);

-- capital_transfer_followup's claim: open transfers of a class, longest idle first.
CREATE INDEX capital_transfer_requests_open ON capital_transfer_requests (network_class, updated_at)
  WHERE status IN ('pending', 'surfaced');
