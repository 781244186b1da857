// Package pgroles creates the database roles of least privilege: per
// service database an owner role that owns the schema and runs the
// migrations, a runtime role that reads and writes the tables and nothing
// else, and read-only roles (the reconciliation report's). It is the one
// place the role SQL lives: the dev stack runs it through
// tools/cmd/pgroles, and tests call Ensure for their per-test databases.
//
// What each role may do, by construction:
//
//   - <service>_owner: LOGIN, CONNECT and CREATE on its database (CREATE so
//     that the outbox's migration can create its publication), USAGE and
//     CREATE on schema public; owns every table, sequence and function in
//     it, so it can migrate. Not a superuser, cannot create databases or
//     roles.
//   - <service>_app: LOGIN, CONNECT on its database only, USAGE on schema
//     public, SELECT/INSERT/UPDATE/DELETE on the tables and USAGE/SELECT on
//     the sequences (now and, through ALTER DEFAULT PRIVILEGES, on those the
//     owner creates later). No CREATE, no TRUNCATE, no ownership: DDL is
//     refused. LISTEN/NOTIFY and the outbox's trigger functions need nothing
//     more.
//   - <service>_repl (Spec.Replication, optional): the log-based relay's
//     walsender connection (REPLICATION_DATABASE_URL). LOGIN and
//     REPLICATION, CONNECT on its database, nothing else: no schema, table
//     or function privilege. pgoutput decodes the WAL with the catalogs and
//     never reads the published table, so streaming needs no SELECT; only
//     an initial copy of the table would (a subscription's table sync), and
//     the relay takes none (its slot is created with NOEXPORT_SNAPSHOT).
//     The publication is created by the owner's migration, not by this
//     role. REPLICATION also allows physical replication of the whole
//     cluster: keep it out of pg_hba.conf's "replication" lines, which
//     logical walsenders do not use.
//   - readers (e.g. reconcile_ro): LOGIN, CONNECT, USAGE and SELECT only.
//
// CONNECT on the database is revoked from PUBLIC, so no other role (another
// service's runtime role in particular) can connect to it.
//
// In each database EXECUTE on pg_logical_emit_message and on the advisory
// lock functions (pg_advisory_lock, pg_try_advisory_lock, the _shared and
// _xact variants, the unlocks) is revoked from PUBLIC and granted to the app
// role and the owner only (invariant 9): otherwise any role that can
// connect — a reader, the replication role — could emit an event the
// WAL-only relay publishes as genuine, or hold the lock the outbox's commit
// trigger takes and block every outbox commit, or take the relays'
// partitions. The owner keeps the locks because golang-migrate takes one.
package pgroles
