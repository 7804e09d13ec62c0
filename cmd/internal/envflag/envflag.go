// Package envflag lets every lockd command read each of its flags from an
// environment variable LOCKD_<NAME> (--max-keys as LOCKD_MAX_KEYS), with a
// flag given on the command line winning. It owns only that mapping.
package envflag

import (
	"flag"
	"fmt"
	"strings"
)

// Name is the environment variable of flag name.
func Name(name string) string {
	return "LOCKD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Apply sets every flag of fs whose variable lookupEnv finds. Call it
// before fs.Parse, so that the command line overrides the environment.
func Apply(fs *flag.FlagSet, lookupEnv func(string) (string, bool)) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil {
			return
		}
		env := Name(f.Name)
		if v, ok := lookupEnv(env); ok {
			if setErr := fs.Set(f.Name, v); setErr != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, setErr)
			}
		}
	})
	return err
}
