package cpusched

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// applyBatch sets SCHED_BATCH on each thread in /proc/self/task that runs
// under the default policy (SCHED_OTHER, which Linux calls SCHED_NORMAL),
// keeping its nice value. A thread being created while the list is read
// may come from one not yet set, so the list is read again until a pass
// finds every thread set.
func applyBatch() (int, error) {
	set := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		tids, err := threads()
		if err != nil {
			return len(set), err
		}
		fresh := 0
		for _, tid := range tids {
			if set[tid] {
				continue
			}
			attr, err := unix.SchedGetAttr(tid, 0)
			if err == nil && attr.Policy == unix.SCHED_NORMAL {
				// Only the policy changes: the nice value stays, and a
				// thread under another policy (chrt, a service manager)
				// keeps it.
				attr.Policy = unix.SCHED_BATCH
				err = unix.SchedSetAttr(tid, attr, 0)
			}
			switch {
			case errors.Is(err, unix.ESRCH): // the thread has exited
				continue
			case err != nil:
				return len(set), fmt.Errorf("set SCHED_BATCH on thread %d: %w", tid, err)
			}
			set[tid] = true
			fresh++
		}
		if fresh == 0 {
			return len(set), nil
		}
	}
	return len(set), nil
}

// threads lists the thread ids of this process.
func threads() ([]int, error) {
	es, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(es))
	for _, e := range es {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}
