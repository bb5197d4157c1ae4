package agent

// InNamespace lets the end-to-end tests (package agent_test) open sockets
// in a lab namespace with the helper this package's tests use.
var InNamespace = inNamespace
