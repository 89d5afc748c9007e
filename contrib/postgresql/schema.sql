-- idemproxy's PostgreSQL store (doc/stores.md, PostgreSQL): one table, one
-- row per idempotency key. idemproxy runs this file when the table is
-- missing at start; a team that manages DDL itself runs it once as a role
-- that may create tables, and grants the proxy's role SELECT, INSERT,
-- UPDATE and DELETE on the table. Every statement is safe to run again.
CREATE TABLE IF NOT EXISTS idemproxy_keys (
    key         text COLLATE "C" PRIMARY KEY, -- <key-prefix><scope>:<idempotency key>
    id          bigint GENERATED ALWAYS AS IDENTITY, -- the order of /keys?state=unknown pages
    state       "char" NOT NULL CHECK (state IN ('L', 'C', 'U')), -- locked, completed, unknown
    fp          bytea NOT NULL,       -- the request's fingerprint (SHA-256)
    token       text NOT NULL,        -- the fencing token of the lock's holder
    changed_at  timestamptz NOT NULL, -- the last change of state
    lease_until timestamptz,          -- locked: the lease runs out then (the heartbeat renews it)
    keep_ms     bigint NOT NULL,      -- --ttl: how long the record is kept after a change
    expires_at  timestamptz NOT NULL, -- the row counts for nothing from then on
    cause       text,                 -- unknown: upstream_timeout, upstream_reset or holder_lost
    about       text,                 -- unknown: "<route> <method> <target>"
    head        bytea,                -- completed: status and headers (idemproxy's encoding)
    body        bytea,                -- completed: the body
    resource    text,                 -- completed: the resource its answer created (a route's resource)
    answer_until timestamptz,         -- completed with a tombstone: its answer expires then, and
                                      -- the row is its tombstone until expires_at
    probes      integer,              -- unknown: the probes of its reconcile claimed (NULL: none)
    probe_next  timestamptz,          -- unknown: no other probe is claimed before this
    probe_result "char",              -- unknown: the last probe's result, 'a' absent or 'f' failed
    absent_at   timestamptz,          -- unknown: the claim of the first absent of the last run
    trace       text                  -- the trace context (W3C traceparent) of the request that
                                      -- locked it, while the row lives (NULL: none)
);
-- A table made before resource links gets their column.
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'idemproxy_keys'::regclass
                   AND attname = 'resource' AND NOT attisdropped) THEN
        ALTER TABLE idemproxy_keys ADD COLUMN resource text;
    END IF;
END $$;
-- A table made before tombstones gets their column.
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'idemproxy_keys'::regclass
                   AND attname = 'answer_until' AND NOT attisdropped) THEN
        ALTER TABLE idemproxy_keys ADD COLUMN answer_until timestamptz;
    END IF;
END $$;
-- A table made before reconcile gets its columns.
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'idemproxy_keys'::regclass
                   AND attname = 'probes' AND NOT attisdropped) THEN
        ALTER TABLE idemproxy_keys ADD COLUMN probes integer, ADD COLUMN probe_next timestamptz,
            ADD COLUMN probe_result "char", ADD COLUMN absent_at timestamptz;
    END IF;
END $$;
-- A table made before tracing gets its column.
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'idemproxy_keys'::regclass
                   AND attname = 'trace' AND NOT attisdropped) THEN
        ALTER TABLE idemproxy_keys ADD COLUMN trace text;
    END IF;
END $$;
-- The background job deletes expired rows in small batches, oldest first.
CREATE INDEX IF NOT EXISTS idemproxy_keys_expires_at ON idemproxy_keys (expires_at);
-- The same job drops the answers of rows that became tombstones.
CREATE INDEX IF NOT EXISTS idemproxy_keys_answer_until ON idemproxy_keys (answer_until)
    WHERE head IS NOT NULL AND answer_until IS NOT NULL;
-- /keys?resource=ID finds the keys whose answer created a resource.
CREATE INDEX IF NOT EXISTS idemproxy_keys_resource ON idemproxy_keys (resource)
    WHERE resource IS NOT NULL;
-- /keys?state=unknown pages through the unknown keys.
CREATE INDEX IF NOT EXISTS idemproxy_keys_unknown ON idemproxy_keys (id) WHERE state = 'U';
