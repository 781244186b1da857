#!/usr/bin/env bash
# Run by the postgres image on its first start (an empty data volume), from
# /docker-entrypoint-initdb.d, after initdb.sql created the databases: the
# least-privilege roles of initdb-roles.sql (generated from package pgroles),
# with the passwords docker-compose.yml passes from .env. See
# docs/operations.md.
set -euo pipefail
vars=()
for role in orders_owner orders_app orders_repl billing_owner billing_app billing_repl shim_owner shim_app reconcile_ro; do
  env_name="PG_${role^^}_PASSWORD"
  [[ -n ${!env_name:-} ]] || { echo "initdb-roles: $env_name is not set (see .env.example)" >&2; exit 1; }
  vars+=(-v "${role}_password=${!env_name}")
done
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres "${vars[@]}" -f /etc/onceflow/initdb-roles.sql
