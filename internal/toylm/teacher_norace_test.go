//go:build !race

package toylm

// teacherNullLevels are the noise levels TestTeacherNullStaysOK runs (see
// teacher_race_test.go).
var teacherNullLevels = []float64{0.1, LoadRegime}
