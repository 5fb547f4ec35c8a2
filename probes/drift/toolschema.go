package drift

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// ErrSchema reports a tool parameter schema outside the supported subset.
var ErrSchema = errors.New("probes: unsupported tool schema")

// ErrToolArgs is wrapped by every reason a tool call's arguments are
// rejected: not JSON, or not valid against the function's schema.
var ErrToolArgs = errors.New("probes: invalid tool arguments")

// Schema is the subset of JSON Schema that function-calling tool
// definitions use (OpenAI `tools[].function.parameters`):
//
//   - type: "object", "string", "number", "integer", "boolean", "array",
//     "null", or a list of them;
//   - properties, required and additionalProperties (a boolean; absent
//     means extra properties are allowed, as in JSON Schema) for objects;
//   - items (one schema) for arrays;
//   - enum (strings, numbers, booleans, null) for any type.
//
// description, title and default are accepted and ignored. Any other
// keyword ($ref, oneOf, pattern, minimum, ...) makes parseSchema fail with
// ErrSchema rather than be silently ignored: a probe must not call
// arguments valid that a stricter reader would reject.
type Schema struct {
	Types                []string           // empty: any type
	Properties           map[string]*Schema // object properties
	Required             []string
	AdditionalProperties *bool // nil: allowed
	Items                *Schema
	Enum                 []any // decoded with json.Number for numbers
}

// schemaIgnored are the annotation keywords that do not constrain values.
var schemaIgnored = map[string]bool{"description": true, "title": true, "default": true, "examples": true}

var schemaTypes = []string{"object", "string", "number", "integer", "boolean", "array", "null"}

// parseSchema decodes a schema of the supported subset.
func parseSchema(data []byte) (*Schema, error) {
	v, err := decodeJSONValue(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSchema, err)
	}
	return schemaOf(v, "")
}

func schemaOf(v any, path string) (*Schema, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: %s: a schema must be a JSON object", ErrSchema, orRoot(path))
	}
	s := &Schema{}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		val := m[k]
		switch k {
		case "type":
			switch t := val.(type) {
			case string:
				s.Types = []string{t}
			case []any:
				for _, x := range t {
					str, ok := x.(string)
					if !ok {
						return nil, fmt.Errorf("%w: %s: type list holds a non-string", ErrSchema, orRoot(path))
					}
					s.Types = append(s.Types, str)
				}
			default:
				return nil, fmt.Errorf("%w: %s: type must be a string or a list", ErrSchema, orRoot(path))
			}
			for _, t := range s.Types {
				if !slices.Contains(schemaTypes, t) {
					return nil, fmt.Errorf("%w: %s: unknown type %q", ErrSchema, orRoot(path), t)
				}
			}
		case "properties":
			props, ok := val.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%w: %s: properties must be an object", ErrSchema, orRoot(path))
			}
			s.Properties = map[string]*Schema{}
			for name, ps := range props {
				sub, err := schemaOf(ps, path+"."+name)
				if err != nil {
					return nil, err
				}
				s.Properties[name] = sub
			}
		case "required":
			list, ok := val.([]any)
			if !ok {
				return nil, fmt.Errorf("%w: %s: required must be a list", ErrSchema, orRoot(path))
			}
			for _, x := range list {
				str, ok := x.(string)
				if !ok {
					return nil, fmt.Errorf("%w: %s: required holds a non-string", ErrSchema, orRoot(path))
				}
				s.Required = append(s.Required, str)
			}
		case "additionalProperties":
			b, ok := val.(bool)
			if !ok {
				return nil, fmt.Errorf("%w: %s: additionalProperties must be a boolean in the supported subset", ErrSchema, orRoot(path))
			}
			s.AdditionalProperties = &b
		case "items":
			sub, err := schemaOf(val, path+"[]")
			if err != nil {
				return nil, err
			}
			s.Items = sub
		case "enum":
			list, ok := val.([]any)
			if !ok || len(list) == 0 {
				return nil, fmt.Errorf("%w: %s: enum must be a non-empty list", ErrSchema, orRoot(path))
			}
			for _, x := range list {
				switch x.(type) {
				case string, json.Number, bool, nil:
				default:
					return nil, fmt.Errorf("%w: %s: enum values must be strings, numbers, booleans or null", ErrSchema, orRoot(path))
				}
			}
			s.Enum = list
		default:
			if !schemaIgnored[k] {
				return nil, fmt.Errorf("%w: %s: keyword %q is not supported", ErrSchema, orRoot(path), k)
			}
		}
	}
	return s, nil
}

func orRoot(path string) string {
	if path == "" {
		return "(root)"
	}
	return strings.TrimPrefix(path, ".")
}

// decodeJSONValue decodes exactly one JSON value, numbers as json.Number.
func decodeJSONValue(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

// ValidateArguments decodes a tool call's arguments string (a JSON text,
// as OpenAI sends it) and validates it against s. The error wraps
// ErrToolArgs and says what is wrong, at which path.
func (s *Schema) ValidateArguments(args string) error {
	v, err := decodeJSONValue([]byte(args))
	if err != nil {
		return fmt.Errorf("%w: arguments are not JSON: %v", ErrToolArgs, err)
	}
	return s.Validate(v)
}

// Validate checks a decoded JSON value (numbers as json.Number or float64)
// against s.
func (s *Schema) Validate(v any) error { return s.validate(v, "") }

func (s *Schema) validate(v any, path string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrToolArgs, orRoot(path), fmt.Sprintf(format, args...))
	}
	if len(s.Types) > 0 {
		ok := false
		for _, t := range s.Types {
			if hasType(v, t) {
				ok = true
				break
			}
		}
		if !ok {
			return bad("want %s, got %s", strings.Join(s.Types, " or "), typeName(v))
		}
	}
	if len(s.Enum) > 0 {
		ok := false
		for _, e := range s.Enum {
			if jsonEqual(e, v) {
				ok = true
				break
			}
		}
		if !ok {
			return bad("value %s is not one of the enum", short(v))
		}
	}
	switch x := v.(type) {
	case map[string]any:
		for _, r := range s.Required {
			if _, ok := x[r]; !ok {
				return bad("missing required field %q", r)
			}
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			sub, ok := s.Properties[k]
			if !ok {
				if s.AdditionalProperties != nil && !*s.AdditionalProperties {
					return bad("unexpected field %q", k)
				}
				continue
			}
			if err := sub.validate(x[k], path+"."+k); err != nil {
				return err
			}
		}
	case []any:
		if s.Items != nil {
			for i, e := range x {
				if err := s.Items.validate(e, path+"["+strconv.Itoa(i)+"]"); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// number returns v's value when it is a JSON number.
func number(v any) (float64, bool) {
	switch n := v.(type) {
	case json.Number:
		f, err := n.Float64()
		return f, err == nil || errors.Is(err, strconv.ErrRange)
	case float64:
		return n, true
	}
	return 0, false
}

func hasType(v any, t string) bool {
	switch t {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	case "number":
		_, ok := number(v)
		return ok
	case "integer":
		// JSON Schema: a number with a zero fractional part (1.0 is one)
		f, ok := number(v)
		return ok && !math.IsInf(f, 0) && f == math.Trunc(f)
	}
	return false
}

func typeName(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case nil:
		return "null"
	}
	if f, ok := number(v); ok {
		if f == math.Trunc(f) {
			return "integer"
		}
		return "number"
	}
	return fmt.Sprintf("%T", v)
}

// jsonEqual compares two enum-able JSON values; numbers by value.
func jsonEqual(a, b any) bool {
	if fa, ok := number(a); ok {
		fb, ok := number(b)
		return ok && fa == fb
	}
	switch x := a.(type) {
	case string:
		y, ok := b.(string)
		return ok && x == y
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case nil:
		return b == nil
	}
	return false
}

// short renders a value for an error message, at most 40 bytes.
func short(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return typeName(v)
	}
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}
