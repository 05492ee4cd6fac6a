package store

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/plugbus/plugbus/internal/sqlstore"
)

// ErrInvalidName is matched by [*InvalidNameError].
var ErrInvalidName = errors.New("store: invalid table name")

// InvalidNameError reports a table name that is not a plain SQL identifier.
// Table names are put in SQL text, so only identifiers are accepted.
type InvalidNameError struct {
	Option string // the option that received it
	Name   string
	Reason string
}

// Error implements error.
func (e *InvalidNameError) Error() string {
	return fmt.Sprintf("store: %s(%q): %s; use letters, digits and underscores, starting with a letter or underscore, at most %d characters", e.Option, e.Name, e.Reason, maxIdentifier)
}

// Is reports whether target is ErrInvalidName.
func (e *InvalidNameError) Is(target error) bool { return target == ErrInvalidName }

// maxIdentifier leaves room for index name suffixes within PostgreSQL's 63 bytes.
const maxIdentifier = 48

var identifierRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// parseTable validates s, the table name given to option, for d.
func parseTable(option, s string, d Dialect) (sqlstore.Table, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 || (len(parts) == 2 && !d.sql().HasSchemas()) {
		reason := "too many dots"
		if !d.sql().HasSchemas() {
			reason = d.String() + " has no schemas: give a table name without a dot"
		}
		return sqlstore.Table{}, &InvalidNameError{Option: option, Name: s, Reason: reason}
	}
	for _, p := range parts {
		switch {
		case p == "":
			return sqlstore.Table{}, &InvalidNameError{Option: option, Name: s, Reason: "empty identifier"}
		case len(p) > maxIdentifier:
			return sqlstore.Table{}, &InvalidNameError{Option: option, Name: s, Reason: "identifier too long"}
		case !identifierRE.MatchString(p):
			return sqlstore.Table{}, &InvalidNameError{Option: option, Name: s, Reason: "not an SQL identifier"}
		}
	}
	if len(parts) == 2 {
		return sqlstore.Table{Schema: parts[0], Name: parts[1]}, nil
	}
	return sqlstore.Table{Name: parts[0]}, nil
}
