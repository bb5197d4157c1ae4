// Package control is the agent's API: the types the CLI and the agent
// exchange, the local control socket's handler and client, the commander
// that turns requests into validated rules commands, and the helpers the
// peer API shares with it.
package control
