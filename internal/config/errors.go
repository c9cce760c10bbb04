package config

import (
	"fmt"

	"github.com/ironlb/ironlb/internal/textlimit"
)

// maxErrText bounds the text of one problem: values are quoted with
// textlimit.Quote, but a selector or a Kubernetes validation message may still
// carry a long value, and the webhook returns several problems in one response.
const maxErrText = 512

// FieldError is one problem found by Parse: which object, which field, and what is
// wrong with the value. Parse joins every FieldError it finds with errors.Join, so
// a user sees all problems at once; errors.As finds the individual ones.
type FieldError struct {
	// Kind is the object's kind: "IPAddressPool" or "L2Advertisement".
	Kind string
	// Name is the object's name.
	Name string
	// Field is the path of the offending field, e.g. "spec.addresses[1]".
	Field string
	// Err says what is wrong; its message quotes the offending value.
	Err error
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s %q: %s: %s", e.Kind, e.Name, e.Field, textlimit.Note(e.Err.Error(), maxErrText))
}

func (e *FieldError) Unwrap() error { return e.Err }

// errs collects FieldErrors for one object.
type errs struct {
	kind, name string
	list       []error
}

func (c *errs) add(field string, format string, args ...any) {
	c.list = append(c.list, &FieldError{Kind: c.kind, Name: c.name, Field: field, Err: fmt.Errorf(format, args...)})
}

func (c *errs) wrap(field string, err error) {
	c.list = append(c.list, &FieldError{Kind: c.kind, Name: c.name, Field: field, Err: err})
}
