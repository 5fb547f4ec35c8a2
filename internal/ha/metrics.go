package ha

import "github.com/VictoriaMetrics/metrics"

// managerMetrics are the fleetwatch_ha_* series of a Manager
// (docs/METRICS.md).
type managerMetrics struct {
	acquired, lost, released *metrics.Counter
	ridden, retaken          *metrics.Counter
	suspended                *metrics.Counter
	ownSkipped, buffered     *metrics.Counter
	dropped                  *metrics.Counter
	takeover                 *metrics.Histogram
}

func newManagerMetrics(m *Manager, set *metrics.Set) managerMetrics {
	mm := managerMetrics{
		acquired:   set.NewCounter("fleetwatch_ha_leases_acquired_total"),
		lost:       set.NewCounter("fleetwatch_ha_leases_lost_total"),
		released:   set.NewCounter("fleetwatch_ha_leases_released_total"),
		ridden:     set.NewCounter("fleetwatch_ha_lease_renewals_ridden_total"),
		retaken:    set.NewCounter("fleetwatch_ha_leases_retaken_total"),
		suspended:  set.NewCounter("fleetwatch_ha_leases_suspended_total"),
		ownSkipped: set.NewCounter("fleetwatch_ha_partition_batches_own_total"),
		buffered:   set.NewCounter("fleetwatch_ha_partition_batches_buffered_total"),
		dropped:    set.NewCounter("fleetwatch_ha_partition_batches_dropped_total"),
		takeover:   set.NewHistogram("fleetwatch_ha_takeover_duration_seconds"),
	}
	set.NewGauge("fleetwatch_ha_partitions_owned", func() float64 {
		v := m.view.Load()
		if v == nil {
			return float64(m.n)
		}
		k := 0
		for _, l := range v.live {
			if l {
				k++
			}
		}
		return float64(k)
	})
	set.NewGauge("fleetwatch_ha_partitions_suspended", func() float64 {
		m.mu.Lock()
		defer m.mu.Unlock()
		k := 0
		for _, l := range m.leases {
			if l.suspended {
				k++
			}
		}
		return float64(k)
	})
	set.NewGauge("fleetwatch_ha_instances", func() float64 {
		m.mu.Lock()
		defer m.mu.Unlock()
		return float64(max(m.members.n, 1))
	})
	return mm
}
