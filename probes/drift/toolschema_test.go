package drift

import (
	"encoding/json"
	"errors"
	"testing"
)

const weatherSchema = `{"type":"object","description":"where","properties":{
	"city":{"type":"string","title":"City"},
	"unit":{"type":"string","enum":["celsius","fahrenheit"]},
	"days":{"type":"integer","default":1},
	"lat":{"type":"number"},
	"alerts":{"type":"boolean"},
	"tags":{"type":"array","items":{"type":"string"}},
	"window":{"type":"object","properties":{"from":{"type":"string"}},"required":["from"]},
	"note":{"type":["string","null"]}},
	"required":["city","unit"],"additionalProperties":false}`

func TestSchemaValidate(t *testing.T) {
	s, err := parseSchema([]byte(weatherSchema))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, args string
		ok         bool
	}{
		{"minimal", `{"city":"Paris","unit":"celsius"}`, true},
		{"every field", `{"city":"Paris","unit":"fahrenheit","days":3,"lat":48.85,"alerts":true,"tags":["a","b"],"window":{"from":"now"},"note":null}`, true},
		{"integer written as 2.0", `{"city":"P","unit":"celsius","days":2.0}`, true},
		{"huge integer", `{"city":"P","unit":"celsius","days":1e300}`, true},
		{"null in a type list", `{"city":"P","unit":"celsius","note":"x"}`, true},
		{"missing required", `{"city":"Paris"}`, false},
		{"enum miss", `{"city":"Paris","unit":"kelvin"}`, false},
		{"wrong type string", `{"city":7,"unit":"celsius"}`, false},
		{"fractional integer", `{"city":"P","unit":"celsius","days":2.5}`, false},
		{"number as string", `{"city":"P","unit":"celsius","lat":"48"}`, false},
		{"boolean as string", `{"city":"P","unit":"celsius","alerts":"true"}`, false},
		{"array item type", `{"city":"P","unit":"celsius","tags":["a",1]}`, false},
		{"nested required", `{"city":"P","unit":"celsius","window":{}}`, false},
		{"additional property", `{"city":"P","unit":"celsius","extra":1}`, false},
		{"not an object", `["Paris"]`, false},
		{"not JSON", `{"city":"Paris","unit":"celsius"`, false},
		{"trailing data", `{"city":"Paris","unit":"celsius"} {}`, false},
		{"empty", ``, false},
	} {
		err := s.ValidateArguments(tc.args)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %s: err %v, want ok %v", tc.name, tc.args, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrToolArgs) {
			t.Errorf("%s: %v does not wrap ErrToolArgs", tc.name, err)
		}
	}
}

func TestSchemaAdditionalPropertiesAllowedByDefault(t *testing.T) {
	s, err := parseSchema([]byte(`{"type":"object","properties":{"a":{"type":"integer"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ValidateArguments(`{"a":1,"b":"anything"}`); err != nil {
		t.Errorf("extra property refused without additionalProperties false: %v", err)
	}
	if err := s.ValidateArguments(`{"a":"1"}`); err == nil {
		t.Error("a known property of the wrong type accepted")
	}
}

func TestParseSchemaRejectsWhatItCannotCheck(t *testing.T) {
	for _, tc := range []string{
		`{"type":"object","properties":{"a":{"$ref":"#/defs/a"}}}`,
		`{"oneOf":[{"type":"string"}]}`,
		`{"type":"string","pattern":"^a"}`,
		`{"type":"integer","minimum":0}`,
		`{"type":"object","additionalProperties":{"type":"string"}}`,
		`{"type":"date"}`,
		`{"type":7}`,
		`{"type":"object","properties":[]}`,
		`{"type":"object","required":"a"}`,
		`{"enum":[]}`,
		`{"enum":[{"a":1}]}`,
		`[]`,
		`{`,
	} {
		if _, err := parseSchema([]byte(tc)); !errors.Is(err, ErrSchema) {
			t.Errorf("%s: err %v, want ErrSchema", tc, err)
		}
	}
}

// FuzzSchemaValidate: arbitrary schemas and arguments never panic; a
// schema that parses accepts what it accepted once again (determinism),
// and the arguments of a valid call stay valid after a JSON round trip.
func FuzzSchemaValidate(f *testing.F) {
	f.Add([]byte(weatherSchema), `{"city":"Paris","unit":"celsius"}`)
	f.Add([]byte(`{"type":"array","items":{"type":"integer"}}`), `[1,2.0,3]`)
	f.Add([]byte(`{"enum":["a",1,true,null]}`), `null`)
	f.Add([]byte(`{"type":["number","string"]}`), `"x"`)
	f.Fuzz(func(t *testing.T, schema []byte, args string) {
		s, err := parseSchema(schema)
		if err != nil {
			if !errors.Is(err, ErrSchema) {
				t.Fatalf("parse error %v does not wrap ErrSchema", err)
			}
			return
		}
		err1 := s.ValidateArguments(args)
		err2 := s.ValidateArguments(args)
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("not deterministic: %v then %v", err1, err2)
		}
		if err1 != nil {
			if !errors.Is(err1, ErrToolArgs) {
				t.Fatalf("error %v does not wrap ErrToolArgs", err1)
			}
			return
		}
		v, err := decodeJSONValue([]byte(args))
		if err != nil {
			t.Fatalf("valid arguments do not decode: %v", err)
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.ValidateArguments(string(again)); err != nil {
			t.Fatalf("%s valid but its re-encoding %s is not: %v", args, again, err)
		}
	})
}
