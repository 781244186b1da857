// Package pgroles creates the database roles of least privilege: per
// service database an owner role that owns the schema and runs the
// migrations, a runtime role that reads and writes the tables and nothing
// else, and read-only roles (the reconciliation report's). It is the one
// place the role SQL lives: the dev stack runs it through
// tools/cmd/pgroles, and tests call Ensure for their per-test databases.
//
// What each role may do, by construction:
//
//   - <service>_owner: LOGIN, CONNECT on its database, USAGE and CREATE on
//     schema public; owns every table, sequence and function in it, so it can
//     migrate. Not a superuser, cannot create databases or roles.
//   - <service>_app: LOGIN, CONNECT on its database only, USAGE on schema
//     public, SELECT/INSERT/UPDATE/DELETE on the tables and USAGE/SELECT on
//     the sequences (now and, through ALTER DEFAULT PRIVILEGES, on those the
//     owner creates later). No CREATE, no TRUNCATE, no ownership: DDL is
//     refused. LISTEN/NOTIFY, advisory locks and the outbox's trigger
//     functions need nothing more (functions are executable by PUBLIC).
//   - readers (e.g. reconcile_ro): LOGIN, CONNECT, USAGE and SELECT only.
//
// CONNECT on the database is revoked from PUBLIC, so no other role (another
// service's runtime role in particular) can connect to it.
package pgroles
