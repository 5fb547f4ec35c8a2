// Package control is the operator side of a fleetwatch deployment: the
// control and override request and reply types that serve answers, the
// JetStream stores serve and the CLI share (baselines, drift states,
// FW_DRIFT, overrides and their audit), and the CLI's clients and text
// views (`fleetwatch drift review|status|rebaseline`, `fleetwatch
// override`, `fleetwatch explain`). It imports the wire vocabulary and probes, never the daemon:
// serve imports it.
package control
