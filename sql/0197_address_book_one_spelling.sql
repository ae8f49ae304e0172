-- 0197_address_book_one_spelling.sql -- an address is in the address book,
-- and has a pending change, under one spelling only (docs/approvals.md,
-- "The address book").
--
-- Requests are matched against the book canonically: the asset in ASCII
-- upper case, the chain as its decimal digits ("01" is "1") or a name in
-- ASCII lower case, the address case-insensitively.  The book's own keys
-- compared exact spellings, so "usdt"/"01"/"0xAB.." and "USDT"/"1"/"0xab.."
-- could be two entries (or two pending adds, both approved) of what a
-- request matches as one, and a quorum-approved removal of one left the
-- other matching.  The unique indexes now key on the canonical forms the
-- matcher uses, through two functions that are their one SQL definition.

CREATE FUNCTION qtg_book_asset(a text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  RETURN translate(a, 'abcdefghijklmnopqrstuvwxyz', 'ABCDEFGHIJKLMNOPQRSTUVWXYZ');

CREATE FUNCTION qtg_book_chain(c text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  RETURN CASE WHEN c ~ '^[0-9]+$' THEN COALESCE(NULLIF(ltrim(c, '0'), ''), '0')
              ELSE translate(c, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz') END;

-- Rows already written in two spellings are not merged here: which entry
-- (or which pending change) stands is an admins' decision, so the
-- migration stops and names them.  A pending change is rejected from the
-- console (vote_address works before this migration); an entry is deleted
-- by the database owner, since a removal through qtg.address_book keys on
-- these functions.
DO $$
DECLARE
  dup text;
BEGIN
  SELECT string_agg(format('%s %s on %s (%s)', a, addr, ch, spellings), '; ')
    INTO dup
    FROM (SELECT qtg_book_asset(asset) AS a, qtg_book_chain(chain) AS ch, lower(address) AS addr,
                 string_agg(format('%s/%s/%s', asset, chain, address), ', ' ORDER BY change_id) AS spellings
            FROM address_book
           GROUP BY 1, 2, 3 HAVING count(*) > 1) d;
  IF dup IS NOT NULL THEN
    RAISE EXCEPTION 'the address book holds one address in several spellings: %', dup
      USING HINT = 'the admins choose the spelling to keep; delete the others from address_book as the database owner (psql), then migrate again';
  END IF;
  SELECT string_agg(format('%s %s on %s (changes %s)', a, addr, ch, ids), '; ')
    INTO dup
    FROM (SELECT qtg_book_asset(asset) AS a, qtg_book_chain(chain) AS ch, lower(address) AS addr,
                 string_agg(id::text, ', ' ORDER BY id) AS ids
            FROM address_book_changes WHERE state = 'PENDING'
           GROUP BY 1, 2, 3 HAVING count(*) > 1) d;
  IF dup IS NOT NULL THEN
    RAISE EXCEPTION 'several address book changes of one address are pending: %', dup
      USING HINT = 'reject all but one (console: vote_address(id, "reject", comment)), then migrate again';
  END IF;
END $$;

CREATE UNIQUE INDEX address_book_one_spelling
  ON address_book (qtg_book_asset(asset), qtg_book_chain(chain), lower(address));

DROP INDEX address_book_changes_one_pending;
CREATE UNIQUE INDEX address_book_changes_one_pending
  ON address_book_changes (qtg_book_asset(asset), qtg_book_chain(chain), lower(address))
  WHERE state = 'PENDING';
