// Package config reads, checks and defaults an agent's configuration: the
// YAML file, then the environment, then flags.
package config
