package peer

import "fmt"

// MaxNameLen bounds a node's name, which its certificate carries.
const MaxNameLen = 64

// CheckName accepts names of 1-64 letters, digits, '-', '_' and '.',
// starting with a letter or digit. Names reach terminals (`shoal query`),
// logs and certificates, so nothing that could be a control character, an
// escape sequence, a space or a path separator gets in.
func CheckName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w: node name %q: want 1-%d characters", ErrInvalid, name, MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '-' && c != '_' && c != '.') {
			return fmt.Errorf("%w: node name %q: use letters, digits, '-', '_' and '.', starting with a letter or digit", ErrInvalid, name)
		}
	}
	return nil
}
