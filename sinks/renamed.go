package sinks

import "fmt"

// Renamed is a key of a sink's section that has a new name. The old key
// is still read for a release, with a warning: a program started with a
// configuration written for the old name keeps its value. The Settings
// keep a field tagged with the old key, documented as deprecated in
// [Type.Docs].
type Renamed struct {
	Sink, Old, New string
}

// Warning is the warning the sink's Warnings gives while the old key is
// set.
func (r Renamed) Warning() string {
	return fmt.Sprintf("sink.%s.%s is deprecated and will be removed; rename it sink.%s.%s", r.Sink, r.Old, r.Sink, r.New)
}

// Int is the value of an int key whose old key holds old and whose new
// key holds cur, def when unset: old when it is set and cur is not.
func (r Renamed) Int(old, cur, def int) int {
	if old != 0 && (cur == 0 || cur == def) {
		return old
	}
	return cur
}

// CheckInt reports a configuration that sets both keys, to different
// values, as one error naming both.
func (r Renamed) CheckInt(old, cur, def int) error {
	if old == 0 || cur == 0 || cur == def || old == cur {
		return nil
	}
	return fmt.Errorf("sink.%s.%s is %d and its deprecated old name sink.%s.%s is %d; remove sink.%s.%s", r.Sink, r.New, cur, r.Sink, r.Old, old, r.Sink, r.Old)
}
