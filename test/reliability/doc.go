// Package reliability holds the service-level fault, soak and abuse tests of
// issue 7: the whole rate limit service (service.Run, in process) answering
// gRPC calls on loopback while real valkey-server processes are killed,
// stalled and restarted under it. The store-level fault tests live in
// internal/store/valkey; docs/reliability.md lists every bound asserted here and
// how to run each test.
package reliability
