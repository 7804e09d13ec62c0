// Package envflag lets every lockd command read each of its flags from an
// environment variable LOCKD_<NAME> (--max-keys as LOCKD_MAX_KEYS), with a
// flag given on the command line winning. It owns that mapping and the
// help text that shows it.
package envflag

import (
	"flag"
	"fmt"
	"io"
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

// PrintFlags writes the help of every flag of fs: --name, the kind of
// value it takes, its usage, its environment variable and its default,
// the default only when it is not the zero value.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		kind, usage := flag.UnquoteUsage(f)
		head := "  --" + f.Name
		if kind != "" {
			head += " " + kind
		}
		note := Name(f.Name)
		if !isZero(f.DefValue) {
			note += "; default " + f.DefValue
		}
		fmt.Fprintf(w, "%s\n    \t%s (%s)\n", head, usage, note)
	})
}

func isZero(value string) bool {
	switch value {
	case "", "0", "false", "0s":
		return true
	}
	return false
}
