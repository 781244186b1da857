-- Run by the postgres image on its first start (an empty data volume), from
-- /docker-entrypoint-initdb.d; see docker-compose.yml. Only the databases,
-- one per service; initdb-roles.sql, run next, creates their roles. Each
-- service migrates its own schema when it starts, as its owner role, as with
-- the dev stack (devstack/stack.sh).
CREATE DATABASE orders;
CREATE DATABASE billing;
CREATE DATABASE shim;
