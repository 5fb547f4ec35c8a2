package drift

import (
	"errors"
	"fmt"
	"strings"
)

// KindTeacher is the kind of the pseudo-prompts a teacher baseline is built
// over (one per fixed text).
const KindTeacher = "teacher"

// MaxTeacherTexts and MaxTeacherTextBytes bound a suite's teacher section.
const (
	MaxTeacherTexts     = 32
	MaxTeacherTextBytes = 4096
)

// ErrKindNoPromptLogprobs is the probe error kind of a backend enrolled with
// teacher-forced scores that stops returning prompt logprobs.
const ErrKindNoPromptLogprobs = "no_prompt_logprobs"

// ErrNoPromptLogprobs is wrapped by the ProbeError of a backend that does
// not score prompts: it answered the echo request with 400, 404, 422 or
// 501, or answered without the prompt's logprobs (it ignored echo). At
// enrolment it means "not supported: sampled probes only"; after an
// enrolment with teacher scores it fails the cycle.
var ErrNoPromptLogprobs = errors.New("probes: backend does not return prompt logprobs")

// TeacherText is one fixed text of a suite's teacher section.
type TeacherText struct {
	ID   string `json:"id"`
	Text string `json:"text"`
}

// validateTeacher checks a suite's teacher section: at most
// MaxTeacherTexts texts with unique, non-empty ids and non-empty texts of
// at most MaxTeacherTextBytes bytes, each of at least two words (the first
// token has no logprob).
func validateTeacher(ts []TeacherText) error {
	if len(ts) > MaxTeacherTexts {
		return fmt.Errorf("%w: %d teacher texts, want at most %d", ErrSuite, len(ts), MaxTeacherTexts)
	}
	seen := map[string]bool{}
	for i, t := range ts {
		switch {
		case t.ID == "" || seen[t.ID]:
			return fmt.Errorf("%w: teacher[%d].id %q is empty or repeated", ErrSuite, i, t.ID)
		case len(strings.Fields(t.Text)) < 2:
			return fmt.Errorf("%w: teacher[%d].text needs at least two words", ErrSuite, i)
		case len(t.Text) > MaxTeacherTextBytes:
			return fmt.Errorf("%w: teacher[%d].text is %d bytes, want at most %d", ErrSuite, i, len(t.Text), MaxTeacherTextBytes)
		}
		seen[t.ID] = true
	}
	return nil
}
