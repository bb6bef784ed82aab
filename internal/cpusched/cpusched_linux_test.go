package cpusched

import (
	"os"
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// parked holds a thread until release is closed and reports its id.
func parked(release <-chan struct{}) int {
	tid := make(chan int)
	go func() {
		runtime.LockOSThread()
		tid <- unix.Gettid()
		<-release
	}()
	return <-tid
}

func policyOf(t *testing.T, tid int) (uint32, int32) {
	t.Helper()
	a, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		t.Fatalf("thread %d: %v", tid, err)
	}
	return a.Policy, a.Nice
}

// Batch reaches every thread under the default policy, the ones the
// runtime starts afterwards too, keeps nice values, and leaves a thread an
// operator put under another policy alone. Inherited changes nothing.
//
// Apply changes the whole process for good, so the test runs in a child
// process of its own, started fresh each time.
func TestApply(t *testing.T) {
	if os.Getenv("CPUSCHED_TEST_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestApply$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "CPUSCHED_TEST_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		t.Logf("child:\n%s", out)
		return
	}
	release := make(chan struct{})
	defer close(release)
	nice, idle := parked(release), parked(release)
	plain := make([]int, 4)
	for i := range plain {
		plain[i] = parked(release)
	}
	if err := unix.Setpriority(unix.PRIO_PROCESS, nice, 5); err != nil {
		t.Fatal(err)
	}
	a, err := unix.SchedGetAttr(idle, 0)
	if err != nil {
		t.Fatal(err)
	}
	a.Policy = unix.SCHED_IDLE
	if err := unix.SchedSetAttr(idle, a, 0); err != nil {
		t.Fatal(err)
	}

	if n, err := Apply(Inherited); n != 0 || err != nil {
		t.Fatalf("Apply(Inherited) = %d, %v; want 0, nil", n, err)
	}
	for _, tid := range plain {
		if p, _ := policyOf(t, tid); p != unix.SCHED_NORMAL {
			t.Fatalf("after Apply(Inherited) thread %d has policy %d, want SCHED_NORMAL", tid, p)
		}
	}

	n, err := Apply(Batch)
	if err != nil {
		t.Fatal(err)
	}
	tids, err := threads()
	if err != nil {
		t.Fatal(err)
	}
	if n < len(plain)+2 {
		t.Fatalf("Apply(Batch) looked at %d threads, want at least the %d parked ones", n, len(plain)+2)
	}
	for _, tid := range tids {
		p, _ := policyOf(t, tid)
		switch {
		case tid == idle && p != unix.SCHED_IDLE:
			t.Errorf("thread %d under SCHED_IDLE was moved to policy %d", tid, p)
		case tid != idle && p != unix.SCHED_BATCH:
			t.Errorf("thread %d has policy %d, want SCHED_BATCH", tid, p)
		}
	}
	if p, nv := policyOf(t, nice); p != unix.SCHED_BATCH || nv != 5 {
		t.Errorf("thread %d: policy %d nice %d, want SCHED_BATCH and nice 5 kept", nice, p, nv)
	}

	// Threads the runtime creates from now on inherit the policy: park more
	// goroutines on threads of their own than the runtime keeps idle.
	known := map[int]bool{}
	for _, tid := range tids {
		known[tid] = true
	}
	more := make(chan struct{})
	defer close(more)
	created := 0
	for range 8 {
		tid := parked(more)
		if !known[tid] {
			created++
		}
		if p, _ := policyOf(t, tid); p != unix.SCHED_BATCH {
			t.Errorf("thread %d, parked after Apply, has policy %d, want SCHED_BATCH", tid, p)
		}
	}
	if created == 0 {
		t.Fatal("no thread was created after Apply; the test proves nothing about inheritance")
	}
}
