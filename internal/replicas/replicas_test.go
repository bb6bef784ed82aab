package replicas

import "testing"

// TestShare: the quota is ceil(pipelines / live); Take refuses past it,
// a release gives room back once, and a replica joining leaves the
// others with an excess to hand back.
func TestShare(t *testing.T) {
	g := New(Config{Pipelines: 6}, 0, nil)
	if s := g.Share(); s.Quota != 6 || s.Live != 1 {
		t.Fatalf("alone: %+v, want quota 6", s)
	}
	g.setLive(3)
	var releases []func()
	for range 2 {
		release, ok := g.Take()
		if !ok {
			t.Fatalf("Take refused under the quota: %+v", g.Share())
		}
		releases = append(releases, release)
	}
	if _, ok := g.Take(); ok {
		t.Fatalf("Take past the quota of 2: %+v", g.Share())
	}
	releases[0]()
	releases[0]() // a second release gives nothing back
	if s := g.Share(); s.Held != 1 {
		t.Fatalf("after one release: %+v, want held 1", s)
	}
	if _, ok := g.Take(); !ok {
		t.Fatal("Take refused after a release")
	}
	g.setLive(2) // a replica died: quota 3
	if _, ok := g.Take(); !ok {
		t.Fatalf("Take refused under the quota of 3: %+v", g.Share())
	}
	g.setLive(4) // two joined: quota 2, three held
	if e := g.Excess(); e != 1 {
		t.Errorf("excess %d with %+v, want 1", e, g.Share())
	}
	if KeyOf([]string{"b=s2", "a=s1"}) != KeyOf([]string{"a=s1", "b=s2"}) {
		t.Error("the key depends on the pipelines' order")
	}
}

// TestRoomAndRescue: Room wakes a waiting stream on a release and when
// fewer replicas are counted, not when more are; a rescue (TakeAbove) is
// held beside the share, never counts as an excess, and gives its room
// back once.
func TestRoomAndRescue(t *testing.T) {
	g := New(Config{Pipelines: 6}, 0, nil)
	g.setLive(3)
	woken := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	a0, _ := g.Take()
	b0, _ := g.Take()
	room := g.Room()
	g.setLive(4)
	if woken(room) {
		t.Error("Room woke when a replica joined")
	}
	g.setLive(3)
	if !woken(room) {
		t.Error("Room did not wake when a replica left")
	}
	a0()
	b0()
	if !woken(g.Room()) {
		t.Error("Room is not closed while there is room")
	}
	a, _ := g.Take()
	b, _ := g.Take()
	room = g.Room()
	rescue := g.TakeAbove()
	if s := g.Share(); s.Held != 3 || s.Rescued != 1 || g.Excess() != 0 {
		t.Fatalf("after a rescue at the share: %+v, excess %d; want held 3, rescued 1, excess 0", s, g.Excess())
	}
	if _, ok := g.Take(); ok {
		t.Fatal("Take beside a rescue at the share")
	}
	rescue()
	rescue()
	if !woken(room) {
		t.Error("Room did not wake on a release")
	}
	if s := g.Share(); s.Held != 2 || s.Rescued != 0 {
		t.Fatalf("after the rescue's release: %+v, want held 2, rescued 0", s)
	}
	a()
	b()
}
