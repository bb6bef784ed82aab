package sinks

import (
	"context"
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

// TestLifecycleContext: Run's context ends with Stop, with its parent, and
// with cancel, whichever comes first.
func TestLifecycleContext(t *testing.T) {
	l := NewLifecycle("test")
	ctx, cancel := l.Context(context.Background())
	defer cancel()
	if ctx.Err() != nil {
		t.Fatal("cancelled before Stop")
	}
	var mu sync.Mutex
	if !l.Stop(&mu) {
		t.Fatal("Stop reported stopped before")
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not cancel Run's context")
	}

	parent, cancelParent := context.WithCancel(context.Background())
	ctx2, cancel2 := NewLifecycle("test").Context(parent)
	defer cancel2()
	cancelParent()
	<-ctx2.Done() // the parent's cancellation reaches it at once
}
