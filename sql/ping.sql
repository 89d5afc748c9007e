-- PING (readiness, once a second): the server answers, is a primary, and
-- this role may read and write the table.
SELECT pg_is_in_recovery(),
       has_table_privilege('idemproxy_keys', 'SELECT, INSERT, UPDATE, DELETE')
