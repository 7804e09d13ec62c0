// Package envflag lets every lockd command read each of its flags from an
// environment variable LOCKD_<NAME> (--max-keys as LOCKD_MAX_KEYS), with a
// flag given on the command line winning. It owns that mapping and the
// help text that shows it.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
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
		if _, ok := f.Value.(*duration); ok && kind == "value" {
			kind = "duration"
		}
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

// DurationVar defines a duration flag like flag.FlagSet.DurationVar whose
// errors say what to write: a bare number gets a hint to add a unit.
func DurationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var((*duration)(p), name, usage)
}

type duration time.Duration

func (d *duration) String() string { return Seconds(time.Duration(*d)) }

// Seconds writes a whole number of seconds as seconds ("255s", not
// "4m15s"), the unit the commands state their ranges in; any other
// duration as time.Duration does.
func Seconds(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

func (d *duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err == nil {
		*d = duration(v)
		return nil
	}
	if _, numErr := strconv.ParseFloat(s, 64); numErr == nil {
		return fmt.Errorf("a bare number has no unit: write %ss (or %sms, %sm)", s, s, s)
	}
	return errors.New("want a duration such as 30s, 1m30s or 500ms")
}
