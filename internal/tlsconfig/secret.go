package tlsconfig

import (
	"fmt"
	"os"
	"strings"
)

// Secret says where a secret (a password, an AUTH token) comes from: a file,
// or else an environment variable. Neither is visible in `ps`, unlike a
// command-line value. The zero value is "no secret".
type Secret struct {
	// File is read whole; one trailing newline (\n or \r\n) is dropped, so
	// `echo pw > file` works. Other white space is kept.
	File string
	// Env is the environment variable read when File is empty.
	Env string
}

// Read returns the secret, "" when neither the file nor the variable is
// set. lookupEnv is os.LookupEnv in production (nil means os.LookupEnv). A
// file that cannot be read, or that is empty, is an error wrapping
// ErrConfig and naming the file; the secret itself is never in an error.
func (s Secret) Read(lookupEnv func(string) (string, bool)) (string, error) {
	if s.File != "" {
		data, err := os.ReadFile(s.File)
		if err != nil {
			return "", fmt.Errorf("%w: secret: %v", ErrConfig, err)
		}
		v := strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
		if v == "" {
			return "", fmt.Errorf("%w: secret file %s is empty", ErrConfig, s.File)
		}
		return v, nil
	}
	if s.Env == "" {
		return "", nil
	}
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	v, _ := lookupEnv(s.Env)
	return v, nil
}
