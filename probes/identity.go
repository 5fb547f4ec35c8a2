package probes

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
)

// infoLabels are the labels of vLLM's configuration info gauges on
// /metrics that belong to a backend's identity tier: what the weights are
// and how they are computed, not how much memory or traffic there is.
// vLLM exports each configuration object as a gauge set to 1 whose labels
// are the object's metrics_info() (vllm/v1/metrics/loggers.py,
// log_metrics_info): `vllm:cache_config_info` (CacheConfig: block_size,
// cache_dtype, num_gpu_blocks, gpu_memory_utilization, ...) in every
// release since v0.4, and, in newer builds, `vllm:model_config_info`
// (ModelConfig: model, dtype, quantization, max_model_len, ...). Labels
// that follow the load or the GPU (num_gpu_blocks, gpu_memory_utilization)
// are left out on purpose: they change on a restart of the same artefact.
var infoLabels = map[string][]string{
	"vllm:model_config_info": {"model", "served_model_name", "quantization", "dtype", "revision", "tokenizer", "max_model_len"},
	"vllm:cache_config_info": {"cache_dtype"},
}

// maxMetricsBytes bounds what is read of /metrics: vLLM's is a few hundred
// KB with many LoRA adapters or engines.
const maxMetricsBytes = 4 << 20

// InfoMetrics reads GET /metrics and returns the infoLabels found, keyed
// "<metric>.<label>". measured is false when /metrics is absent or not
// readable (any error, status or timeout): the identity tier then skips
// the info labels this cycle, it is never a probe error.
func (c *Client) InfoMetrics(ctx context.Context) (info map[string]string, measured bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/metrics", nil)
	if err != nil {
		return nil, false
	}
	req.Header.Set("Accept", "text/plain")
	if c.t.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.t.APIKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, false
	}
	info, err = ParseInfoMetrics(bufio.NewReaderSize(&limitedReader{r: resp.Body, n: maxMetricsBytes}, 64<<10))
	if err != nil {
		return nil, false
	}
	return info, true
}

type limitedReader struct {
	r interface{ Read([]byte) (int, error) }
	n int
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errMetricsTooLarge
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= n
	return n, err
}

var errMetricsTooLarge = errors.New("probes: /metrics too large")

// ParseInfoMetrics reads Prometheus text exposition and returns the labels
// of infoLabels found, keyed "<metric>.<label>". Other series are
// skipped; a malformed info series is skipped too (an exposition is not
// ours to validate).
func ParseInfoMetrics(r *bufio.Reader) (map[string]string, error) {
	info := map[string]string{}
	for {
		line, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// a very long line: no info gauge of ours is that long
			for err == bufio.ErrBufferFull {
				_, err = r.ReadSlice('\n')
			}
			continue
		}
		if len(line) > 0 && line[0] == 'v' {
			parseInfoLine(bytes.TrimRight(line, "\r\n"), info)
		}
		if err != nil {
			if errors.Is(err, errMetricsTooLarge) {
				return nil, err
			}
			return info, nil
		}
	}
}

func parseInfoLine(line []byte, info map[string]string) {
	brace := bytes.IndexByte(line, '{')
	if brace < 0 {
		return
	}
	labels, ok := infoLabels[string(line[:brace])]
	if !ok {
		return
	}
	metric := string(line[:brace])
	kv, ok := parseLabels(line[brace+1:])
	if !ok {
		return
	}
	for _, l := range labels {
		if v, has := kv[l]; has {
			info[metric+"."+l] = v
		}
	}
}

// parseLabels parses `name="value",...}` (the part after '{') with the
// escapes of the text format (\\, \", \n).
func parseLabels(b []byte) (map[string]string, bool) {
	out := map[string]string{}
	for {
		b = bytes.TrimLeft(b, " ,")
		if len(b) == 0 {
			return nil, false
		}
		if b[0] == '}' {
			return out, true
		}
		eq := bytes.IndexByte(b, '=')
		if eq <= 0 || eq+1 >= len(b) || b[eq+1] != '"' {
			return nil, false
		}
		name := strings.TrimSpace(string(b[:eq]))
		b = b[eq+2:]
		var v strings.Builder
		closed := false
		for i := 0; i < len(b); i++ {
			switch c := b[i]; {
			case c == '\\' && i+1 < len(b):
				i++
				if b[i] == 'n' {
					v.WriteByte('\n')
				} else {
					v.WriteByte(b[i])
				}
			case c == '"':
				b, closed = b[i+1:], true
			default:
				v.WriteByte(c)
			}
			if closed {
				break
			}
		}
		if !closed {
			return nil, false
		}
		out[name] = v.String()
	}
}
