package probes

import (
	"errors"

	"github.com/robfig/cron/v3"
)

// ErrInvalidTarget is wrapped by New's errors about a Target.
var ErrInvalidTarget = errors.New("probes: invalid target")

// ParseSchedule parses a cron spec as the Prober and the Reviewer read
// Settings.Schedule and ReviewSettings.Schedule: five standard fields, or a
// descriptor such as "@every 5m" or "@daily". Configuration files check
// their schedules with it, so there is one rule.
func ParseSchedule(spec string) (cron.Schedule, error) { return cron.ParseStandard(spec) }
