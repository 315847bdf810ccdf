package xds

import "github.com/prometheus/client_golang/prometheus"

// The client's metrics (docs/monitoring.md), named beside the
// ratelimit_config_* series of the config loads: whether the stream to the
// server is up, how often the client tried to open one, why streams ended,
// and when the last response came. A broken stream otherwise shows only in
// the logs, while every new or changed policy misses the service.
var (
	streamUpDesc = prometheus.NewDesc("ratelimit_config_xds_stream_up",
		"1 while an xDS stream to the config server (CONFIG_GRPC_XDS_SERVER_URL) is open, 0 while the client reconnects: new and changed configs do not arrive, the last good one stays in force.",
		nil, nil)
	connectAttemptsDesc = prometheus.NewDesc("ratelimit_config_xds_connect_attempts_total",
		"xDS streams the client tried to open (the first, and every reconnect after its backoff).",
		nil, nil)
	streamErrorsDesc = prometheus.NewDesc("ratelimit_config_xds_stream_errors_total",
		"xDS streams that failed to open or ended, by reason: connect (server unreachable, connection or TLS handshake refused), tls_config (the client's TLS files could not be loaded), closed (the server ended the stream), broken (connection lost, GOAWAY, keepalive unanswered, another gRPC status), too_large (a response over XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES).",
		[]string{"reason"}, nil)
	lastReceivedDesc = prometheus.NewDesc("ratelimit_config_xds_last_received_timestamp_seconds",
		"Unix time of the last response from the xDS server, applied or rejected (ratelimit_config_last_load_success{source=\"xds\"} says which); 0 before the first.",
		nil, nil)
)

// Collector exports the client's Stats, read at scrape time as
// internal/ratelimit/storemetrics exports a store's: one Stats copy per
// scrape, nothing on the request path. Every reason's series exists from
// the start, at zero, so an alert on an increase can fire on a fresh pod.
func (c *Client) Collector() prometheus.Collector { return collector{c} }

type collector struct{ c *Client }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- streamUpDesc
	ch <- connectAttemptsDesc
	ch <- streamErrorsDesc
	ch <- lastReceivedDesc
}

func (k collector) Collect(ch chan<- prometheus.Metric) {
	s := k.c.Stats()
	up, last := 0.0, 0.0
	if s.Up {
		up = 1
	}
	if !s.LastReceived.IsZero() {
		last = float64(s.LastReceived.UnixNano()) / 1e9
	}
	ch <- prometheus.MustNewConstMetric(streamUpDesc, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(connectAttemptsDesc, prometheus.CounterValue, float64(s.Attempts))
	for _, r := range StreamErrorReasons {
		ch <- prometheus.MustNewConstMetric(streamErrorsDesc, prometheus.CounterValue, float64(s.ErrorReasons[r]), r)
	}
	ch <- prometheus.MustNewConstMetric(lastReceivedDesc, prometheus.GaugeValue, last)
}
