// Package monitoring holds Quotient's Grafana dashboard
// (grafana-dashboard.json) and Prometheus alerting rules (alerts.yml) for
// gateways and coordinators, with the thresholds of seed design 9.3. Its
// test checks that both files parse and that every quotient_* metric they
// query is one the code registers. It has no Go API.
package monitoring
