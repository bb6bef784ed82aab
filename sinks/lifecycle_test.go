package sinks

import (
	"sync"
	"testing"
	"time"
)

func TestLifecycle(t *testing.T) {
	l := NewLifecycle("test")
	if err := l.Enter(); err != nil {
		t.Fatal(err)
	}
	if err := l.Enter(); err == nil {
		t.Fatal("a second Run entered while the first runs")
	}
	var mu sync.Mutex
	exited := make(chan struct{})
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		if l.Sleep(t.Context(), time.Hour) {
			t.Error("Sleep ran its course although the sink stopped")
		}
		close(exited)
		l.Exit()
	}()
	if !l.Stop(&mu) {
		t.Fatal("the first Stop reported the sink stopped before")
	}
	select {
	case <-exited:
	default:
		t.Fatal("Stop returned before Run did")
	}
	<-runDone
	if !l.Stopped() {
		t.Error("Stopped is false after Stop")
	}
	if l.Stop(&mu) {
		t.Error("a second Stop reported a first stop")
	}
	// A Run after Close enters, sees Quit closed and returns.
	if err := l.Enter(); err != nil {
		t.Fatalf("Run after Close: %v", err)
	}
	l.Exit()
}
