package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// costs is one sample of the CPU used so far by the server, this process
// and redis-server (seconds), and Redis's command counters.
type costs struct {
	server, load, redis float64
	cmds                map[string][2]float64 // command: calls, µs
}

// sample reads the counters now; what cannot be read stays zero.
func sample(serverPID int, redisAddr string) costs {
	c := costs{load: procCPU("self"), cmds: map[string][2]float64{}}
	if serverPID > 0 {
		c.server = procCPU(strconv.Itoa(serverPID))
	}
	if redisAddr == "" {
		return c
	}
	rc := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := rc.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-rls: redis INFO:", err)
		return c
	}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_cpu_sys" || k == "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			c.redis += f
		case strings.HasPrefix(k, "cmdstat_"):
			var calls, usec float64
			for _, kv := range strings.Split(v, ",") {
				name, val, _ := strings.Cut(kv, "=")
				switch name {
				case "calls":
					calls, _ = strconv.ParseFloat(val, 64)
				case "usec":
					usec, _ = strconv.ParseFloat(val, 64)
				}
			}
			c.cmds[strings.TrimPrefix(k, "cmdstat_")] = [2]float64{calls, usec}
		}
	}
	return c
}

// procCPU is the user+system CPU of /proc/PID (or self), in seconds.
func procCPU(pid string) float64 {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from 3 (state) on
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ is 100 on Linux
}

// per formats the CPU (µs) and the Redis commands per decision between
// before and c, over n decisions.
func (c costs) per(before costs, n float64) string {
	us := func(a, b float64) string { return strconv.FormatFloat((a-b)*1e6/n, 'f', 1, 64) }
	out := fmt.Sprintf("server_cpu_us=%s load_cpu_us=%s redis_cpu_us=%s", us(c.server, before.server), us(c.load, before.load), us(c.redis, before.redis))
	var names []string
	for k := range c.cmds {
		if c.cmds[k][0] > before.cmds[k][0] && k != "info" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names {
		calls, usec := c.cmds[k][0]-before.cmds[k][0], c.cmds[k][1]-before.cmds[k][1]
		out += fmt.Sprintf(" redis_%s=%.3f/dec,%.1fus/dec", k, calls/n, usec/n)
	}
	return out
}
