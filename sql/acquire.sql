-- ACQUIRE: $1 the store key, $2 fingerprint, $3 fencing token, $4 lease
-- (ms), $5 keep (ms), $6 take over a lapsed lock or an unknown key
-- (on-unknown-outcome retry; false: a lapsed lock becomes unknown), $7
-- what an unknown record says of its request, $8 look at tombstones, $9
-- the acquiring request's trace context ('': none), kept in trace while the
-- row lives (a take-over writes its own; a lapsed lock made unknown keeps
-- its holder's).
-- lua/acquire.lua's state machine: a row that expired counts as none, and
-- so does a tombstone (a completed row past its answer_until: doc/stores.md,
-- The table) when not $8.
-- The row as this statement's snapshot has it answers by itself when no
-- change follows from it (another fingerprint, completed, in flight, this
-- token's own lock, unknown without a take-over): then nothing is written
-- and the commit waits for no disk, which is what a replay costs. Else the
-- insert, or the update of the row it may change, answers with the row as
-- it made it. No row at all (a row another proxy inserted after this
-- statement's snapshot, and would not give up) is answered by sending it
-- again.
-- Columns: state, changed (this statement made the row), mismatch, mine
-- (the token is $3), cause, about, head, body, resource, tomb (a
-- tombstone: the answer is not sent), trace (the row's trace context; a
-- lock this statement made unknown keeps its holder's).
WITH cur AS (
    SELECT state, fp, token, lease_until, cause, about, head, body, resource, trace,
           coalesce(answer_until <= now(), false) AS tomb
    FROM idemproxy_keys
    WHERE key = $1 AND expires_at > now() AND ($8::boolean OR NOT coalesce(answer_until <= now(), false))
),
ins AS (
    INSERT INTO idemproxy_keys AS k
        (key, state, fp, token, changed_at, lease_until, keep_ms, expires_at, trace)
    SELECT $1::text, 'L', $2::bytea, $3::text, now(),
           now() + $4::bigint * interval '1 millisecond', $5::bigint,
           now() + ($4::bigint + $5::bigint) * interval '1 millisecond', NULLIF($9::text, '')
    WHERE NOT EXISTS (
        SELECT FROM cur
        WHERE fp <> $2::bytea OR state = 'C'
           OR (state = 'L' AND (token = $3::text OR lease_until > now()))
           OR (state = 'U' AND NOT $6::boolean))
    ON CONFLICT (key) DO UPDATE SET
        state = CASE WHEN k.expires_at > now() AND k.state = 'L' AND NOT $6::boolean
                     THEN 'U' ELSE 'L' END,
        fp = EXCLUDED.fp,
        token = CASE WHEN k.expires_at > now() AND k.state = 'L' AND NOT $6::boolean
                     THEN k.token ELSE EXCLUDED.token END,
        changed_at = now(),
        lease_until = CASE WHEN k.expires_at > now() AND k.state = 'L' AND NOT $6::boolean
                           THEN NULL ELSE EXCLUDED.lease_until END,
        keep_ms = CASE WHEN k.expires_at > now() AND k.state = 'L' AND NOT $6::boolean
                       THEN k.keep_ms ELSE EXCLUDED.keep_ms END,
        expires_at = CASE WHEN k.expires_at > now() AND k.state = 'L' AND NOT $6::boolean
                          THEN now() + k.keep_ms * interval '1 millisecond'
                          ELSE EXCLUDED.expires_at END,
        cause = CASE WHEN k.expires_at > now() AND k.state = 'L' AND NOT $6::boolean
                     THEN 'holder_lost' END,
        about = CASE WHEN k.expires_at > now() AND k.state = 'L' AND NOT $6::boolean
                     THEN $7::text END,
        trace = CASE WHEN k.expires_at > now() AND k.state = 'L' AND NOT $6::boolean
                     THEN k.trace ELSE EXCLUDED.trace END,
        head = NULL,
        body = NULL,
        resource = NULL,
        answer_until = NULL,
        probes = NULL, probe_next = NULL, probe_result = NULL, absent_at = NULL
    WHERE k.expires_at <= now() OR (NOT $8::boolean AND k.answer_until <= now())
       OR (k.fp = EXCLUDED.fp
           AND ((k.state = 'L' AND k.token <> EXCLUDED.token AND k.lease_until <= now())
                OR (k.state = 'U' AND $6::boolean)))
    RETURNING k.state, true AS changed, false AS mismatch, k.token = $3::text AS mine, k.cause,
              k.about, NULL::bytea AS head, NULL::bytea AS body, NULL::text AS resource,
              false AS tomb, k.trace
)
SELECT * FROM ins
UNION ALL
SELECT state, false, fp <> $2::bytea, token = $3::text, cause, about,
       CASE WHEN NOT tomb THEN head END, CASE WHEN NOT tomb THEN body END, resource, tomb,
       trace
FROM cur
WHERE NOT EXISTS (SELECT FROM ins)
