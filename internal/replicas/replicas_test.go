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
