// Package pgerr classifies Postgres errors: an outage to wait out
// (IsUnavailable), data Postgres refuses for good (IsPermanent), and the
// translation of driver errors into a store's named errors (StoreErrors).
//
// The libraries' stores use it, and so can yours: the platform's services
// translate their own stores' errors with it, so that a service and the
// libraries inside it agree on what an outage is. It is public, rather than
// internal to the libraries, for that reason; it imports only pgx.
package pgerr
