package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestHealthcheckExitCodes(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer ok.Close()
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer bad.Close()
	for _, tc := range []struct {
		url  string
		code int
	}{
		{ok.URL, exitOK},
		{bad.URL, exitUnhealthy},
		{"http://127.0.0.1:1/healthz", exitUnhealthy},
		{"::not a url", exitUsage},
	} {
		var out, errOut bytes.Buffer
		if got := runMain([]string{"healthcheck", "--url", tc.url}, &out, &errOut); got != tc.code {
			t.Errorf("healthcheck %s: exit %d, want %d (%s)", tc.url, got, tc.code, errOut.String())
		}
	}
}
