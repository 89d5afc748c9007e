-- PROBE (doc/configuration.md, Reconcile): a step $2 of the reconcile of the
-- unknown key $1: 'claim' (allowed $3 ms after the key became unknown, then
-- once per $4 ms, $5 times in all), 'found' (completes it with head $7 and
-- body $8, kept its keep_ms or $3 ms, as resolve.sql), 'absent' (the claim
-- at $6 ms since the epoch said so: the second of a run, at least 1000 ms
-- after the first, deletes the row), 'failed'. The probe's count, the time
-- before which no other may start, its last result ('a' absent, 'f'
-- failed) and the first absent of the run are columns of the row.
-- The row is locked first (cur, which every branch reads), and each change
-- is decided on the row as locked: two steps on one key run one after the
-- other, the second seeing what the first wrote (two absents a second
-- apart, each deciding on its statement's snapshot, could both find
-- nothing to do, and a claim refused meanwhile would read an old wait). A
-- found, absent or failed claimed before the key last became unknown (sent
-- before changed_at) belongs to an earlier period: known, nothing written.
-- Columns: answer ('claimed', 'later', 'spent', 'known', 'noted',
-- 'released'), ms (claimed: the claim's time since the epoch; later: the
-- wait), probes. No row: no such key.
WITH cur AS (
    SELECT state, coalesce(probes, 0) AS probes, probe_result, absent_at, keep_ms,
           greatest(changed_at + $3::bigint * interval '1 millisecond',
                    coalesce(probe_next, '-infinity')) AS allowed,
           $6::bigint >= (extract(epoch FROM changed_at) * 1000)::bigint AS this_period
    FROM idemproxy_keys
    WHERE key = $1 AND expires_at > now()
    FOR UPDATE
),
claim AS (
    UPDATE idemproxy_keys k
    SET probes = cur.probes + 1, probe_next = now() + $4::bigint * interval '1 millisecond'
    FROM cur
    WHERE k.key = $1 AND $2::text = 'claim' AND cur.state = 'U' AND cur.probes < $5::bigint
      AND now() >= cur.allowed
    RETURNING 'claimed'::text AS answer, (extract(epoch FROM now()) * 1000)::bigint AS ms,
              k.probes::bigint
),
found AS (
    UPDATE idemproxy_keys k
    SET state = 'C', head = $7::bytea, body = $8::bytea, cause = NULL, about = NULL,
        changed_at = now(), lease_until = NULL,
        expires_at = now() + (CASE WHEN cur.keep_ms > 0 THEN cur.keep_ms ELSE $3::bigint END)
                             * interval '1 millisecond'
    FROM cur
    WHERE k.key = $1 AND $2::text = 'found' AND cur.state = 'U' AND cur.this_period
    RETURNING k.key
),
released AS (
    DELETE FROM idemproxy_keys k
    USING cur
    WHERE k.key = $1 AND $2::text = 'absent' AND cur.state = 'U' AND cur.this_period
      AND cur.probe_result = 'a'
      AND $6::bigint >= (extract(epoch FROM cur.absent_at) * 1000)::bigint + 1000
    RETURNING k.key
),
noted AS (
    UPDATE idemproxy_keys k
    SET absent_at = CASE WHEN $2::text = 'failed' THEN NULL
                         WHEN cur.probe_result = 'a'
                         THEN least(cur.absent_at, to_timestamp($6::bigint / 1000.0))
                         ELSE to_timestamp($6::bigint / 1000.0) END,
        probe_result = CASE WHEN $2::text = 'failed' THEN 'f' ELSE 'a' END
    FROM cur
    WHERE k.key = $1 AND $2::text IN ('absent', 'failed') AND cur.state = 'U' AND cur.this_period
      AND NOT ($2::text = 'absent' AND coalesce(cur.probe_result = 'a'
               AND $6::bigint >= (extract(epoch FROM cur.absent_at) * 1000)::bigint + 1000, false))
    RETURNING k.key
)
SELECT * FROM claim
UNION ALL
SELECT 'noted', 0::bigint, 0::bigint FROM found, LATERAL pg_notify('idemproxy_done', found.key)
UNION ALL
SELECT 'released', 0, 0 FROM released, LATERAL pg_notify('idemproxy_done', released.key)
UNION ALL
SELECT 'noted', 0, 0 FROM noted
UNION ALL
SELECT CASE WHEN state <> 'U' OR $2::text <> 'claim' THEN 'known'
            WHEN probes >= $5::bigint THEN 'spent' ELSE 'later' END,
       CASE WHEN state = 'U' AND $2::text = 'claim' AND probes < $5::bigint
            THEN greatest((extract(epoch FROM allowed - now()) * 1000)::bigint, 1) ELSE 0 END,
       probes::bigint
FROM cur
WHERE NOT EXISTS (SELECT FROM claim) AND NOT EXISTS (SELECT FROM found)
  AND NOT EXISTS (SELECT FROM released) AND NOT EXISTS (SELECT FROM noted)
