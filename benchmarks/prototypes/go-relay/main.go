// PROTOTYPE, not shipped: the proxy's write-mode hot path as a compiled relay, for issue 15 item 3.
//
// It measures what a compiled relay costs per request and per chunk in benchmarks/proxy_overhead.py
// (--go-relay BINARY). Per client request it does what pdctl proxy does on the hot path: parse the JSON
// body, build both legs (prefill: stream false, max_tokens 1, kv_transfer_params; decode: the body plus
// kv_transfer_params), mint the ids, send decode and prefill at once over pooled keep-alive connections,
// cancel decode if prefill fails, and stream decode's answer with the internal request id replaced by
// the public one. It has none of the rest (registration, validation, routing, errors, metrics, logs):
// the engines are given as flags.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"time"
)

var client = &http.Client{Transport: &http.Transport{
	MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: 4 * time.Second, DisableCompression: true,
	DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
}}

func token(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

type relay struct{ prefill, decode string }

func (r relay) leg(ctx context.Context, host string, requestID string, body map[string]any) (*http.Response, error) {
	encoded, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+host+"/v1/completions", bytes.NewReader(encoded))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", requestID)
	return client.Do(req)
}

func (r relay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	raw, err := io.ReadAll(req.Body)
	var body map[string]any
	if err == nil {
		err = json.Unmarshal(raw, &body)
	}
	if err != nil {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	uid := token(16)
	transferID := "tx-" + token(16)
	requestID := "___prefill_addr_host:127.0.0.1,handshake:6301,notify:6105___decode_addr_host:127.0.0.1,handshake:7301,notify:7501_" + uid
	prefillBody := make(map[string]any, len(body)+1)
	decodeBody := make(map[string]any, len(body)+1)
	for k, v := range body {
		prefillBody[k], decodeBody[k] = v, v
	}
	prefillBody["stream"], prefillBody["max_tokens"] = false, 1
	delete(prefillBody, "stream_options")
	prefillBody["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "transfer_id": transferID, "remote_dp_size": 1, "remote_tp_size": 1}
	decodeBody["kv_transfer_params"] = map[string]any{"do_remote_decode": false, "do_remote_prefill": true,
		"remote_engine_id": nil, "remote_block_ids": nil, "transfer_id": transferID, "remote_dp_size": 1, "remote_tp_size": 1,
		"remote_host": "127.0.0.1", "remote_handshake_port": 6301, "remote_notify_port": 6105}

	ctx, cancel := context.WithCancel(req.Context())
	defer cancel()
	go func() { // write mode: prefill alongside decode; its failure cancels decode
		resp, err := r.leg(ctx, r.prefill, requestID, prefillBody)
		if err != nil {
			cancel()
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			cancel()
		}
	}()
	resp, err := r.leg(ctx, r.decode, requestID, decodeBody)
	if err != nil {
		http.Error(w, `{"error":{"message":"decode failed"}}`, http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(resp.StatusCode)
	flusher := w.(http.Flusher)
	internal, public := []byte(requestID), []byte(uid)
	buf := make([]byte, 64*1024)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(bytes.ReplaceAll(buf[:n], internal, public)); werr != nil {
				return // the client went away: the deferred cancel closes both legs
			}
			flusher.Flush()
		}
		if err != nil {
			return
		}
	}
}

func main() {
	port := flag.String("port", "8000", "listen port")
	prefill := flag.String("prefill", "", "prefill host:port")
	decode := flag.String("decode", "", "decode host:port")
	flag.Parse()
	log.Fatal(http.ListenAndServe("127.0.0.1:"+*port, relay{*prefill, *decode}))
}
