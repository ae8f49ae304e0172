-- 0071_principals_address_book.sql -- named operators and the address book
-- (docs/approvals.md).
--
-- operators: a console uid maps to one named operator and its roles
-- (read, operate, approve, admin).  A uid with no row may read, not mutate.
CREATE TABLE operators (
  name        text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_.-]{0,62}$'),
  uid         bigint UNIQUE CHECK (uid >= 0),
  roles       text[] NOT NULL CHECK (roles <@ ARRAY['read', 'operate', 'approve', 'admin']::text[]),
  created_by  text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now()
);

-- The address book: destinations per asset and chain, with a label.  A row
-- exists only once a change adding it met its quorum of admins; removing
-- it takes the same.
CREATE TABLE address_book (
  asset       text NOT NULL CHECK (asset <> ''),
  chain       text NOT NULL CHECK (chain <> ''),
  address     text NOT NULL CHECK (address <> ''),
  label       text NOT NULL CHECK (label <> ''),
  change_id   bigint NOT NULL,
  added_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (asset, chain, address)
);

CREATE TABLE address_book_changes (
  id                  bigserial PRIMARY KEY,
  action              text NOT NULL CHECK (action IN ('add', 'remove')),
  asset               text NOT NULL CHECK (asset <> ''),
  chain               text NOT NULL CHECK (chain <> ''),
  address             text NOT NULL CHECK (address <> ''),
  label               text,
  state               text NOT NULL DEFAULT 'PENDING' CHECK (state IN ('PENDING', 'APPLIED', 'REJECTED')),
  approvals_required  int NOT NULL CHECK (approvals_required >= 1),
  proposed_by         text NOT NULL,
  created_at          timestamptz NOT NULL DEFAULT now(),
  decided_at          timestamptz
);

CREATE UNIQUE INDEX address_book_changes_one_pending
  ON address_book_changes (asset, chain, address) WHERE state = 'PENDING';

CREATE TABLE address_book_votes (
  change_id   bigint NOT NULL REFERENCES address_book_changes(id),
  principal   text NOT NULL CHECK (principal <> ''),
  decision    text NOT NULL CHECK (decision IN ('approve', 'reject')),
  comment     text,
  created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (change_id, principal)
);

-- The velocity windows sum approved/executing amounts per asset: index the
-- requests by the time they were approved.
CREATE INDEX movement_requests_approved_at ON movement_requests (network_class, approved_at)
  WHERE approved_at IS NOT NULL;
