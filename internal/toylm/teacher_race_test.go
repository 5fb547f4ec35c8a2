//go:build race

package toylm

// teacherNullLevels are the noise levels TestTeacherNullStaysOK runs: under
// the race detector the load regime alone (the one where the teacher tier's
// statistics differ most from the sampled tier's), to keep the race suite's
// time (see race_test.go).
var teacherNullLevels = []float64{LoadRegime}
