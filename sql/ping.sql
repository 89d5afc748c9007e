-- PING (readiness, once a second): the server answers, and is a primary.
SELECT pg_is_in_recovery()
