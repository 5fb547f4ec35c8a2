package dashboards

import _ "embed"

//go:embed alerts.yaml
var alertRules []byte

// AlertRules returns the Prometheus alerting rules for fleetwatch's own
// metrics (a rule file for Prometheus or vmalert): ingest stalled, rejects
// rising, snapshots not published, pools with every backend open, probe
// errors and failing notification receivers.
func AlertRules() []byte { return append([]byte(nil), alertRules...) }
