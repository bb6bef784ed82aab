package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// needChromium is the path of Debian's chromium; without it the test
// skips, and fails under CI=true (.ci/services installs it).
func needChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "/usr/bin/chromium"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (Debian package chromium; .ci/services installs it)")
	}
	t.Skip("chromium is not installed: the console's browser test needs it (apt-get install chromium; CI=true makes this a failure)")
	return ""
}

// browser starts a headless chromium of the test's own (a fresh profile,
// nothing fetched in the background) and returns a tab.
func browser(t *testing.T, chromium string) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1360, 1000),
	)
	tab, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	if err := chromedp.Do(tab); err != nil { // starts the browser, outside any timeout
		t.Fatalf("start chromium: %v", err)
	}
	return tab
}

// TestConsoleInBrowser drives the console at /ui in a real chromium against
// a relay of two pipelines, each with its database and Kafka:
//   - the page lists both pipelines with their lag;
//   - actions are refused without a session (401) and, signed in, without
//     the CSRF token (403), and those refusals are audited;
//   - a dead letter (the broker refused its topic, as without an ACL) and
//     the two messages parked behind it are opened on the page, the fault
//     is fixed, and the page replays them: all three reach the broker, in
//     order;
//   - pipeline b is paused from the page (rows committed meanwhile do not
//     arrive) and resumed: every row of b's ledger arrives, 0 lost.
//
// Screenshots go to the test's artifact dir (go test -artifacts), and to
// $OUTBOXRELAY_CONSOLE_SCREENSHOT when it is set (docs/images/console.png).
func TestConsoleInBrowser(t *testing.T) {
	chromium := needChromium(t)
	a := newEnvWith(t, serverFor(t), "", "--slot", "console_a")
	b := newEnvWith(t, serverFor(t), "", "--slot", "console_b")
	token := filepath.Join(t.TempDir(), "action-token")
	if err := os.WriteFile(token, []byte("console-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// a's broker refuses the invoice topic until the test fixes it.
	acl := a.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "outbox.invoice", Err: kerr.TopicAuthorizationFailed, Count: -1})
	cfg := fmt.Sprintf(`postgres:
  status_interval: 200ms
sink:
  type: kafka
relay:
  max_attempts: 1
http:
  listen: 127.0.0.1:0
  action_token_file: %s
pipelines:
  - name: orders
    postgres:
      url: %s
      slot: console_a
    sink:
      kafka:
        brokers: [%s]
  - name: billing
    postgres:
      url: %s
      slot: console_b
    sink:
      kafka:
        brokers: [%s]
`, token, a.dbURL, a.brokers, b.dbURL, b.brokers)
	p := a.startConfig(cfg)
	base := "http://" + p.httpAddr()
	waitReady(t, base+"/readyz", 200, 60*time.Second)
	ordersA, invoices, ordersB := a.consume("outbox.order"), a.consume("outbox.invoice"), b.consume("outbox.order")
	ledgerA := a.insert("outbox", "order", "1", 5)
	ledgerB := b.insert("outbox", "order", "1", 5)
	ordersA.waitIDs(ledgerA, 30*time.Second)
	ordersB.waitIDs(ledgerB, 30*time.Second)

	tab := browser(t, chromium)
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(tab, 60*time.Second)
		defer cancel()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v\nnotice: %s", what, err, text(t, tab, "#notice"))
		}
	}
	eval := func(js string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(tab, 30*time.Second)
		defer cancel()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("evaluate %s: %v", js, err)
		}
		return v
	}
	poll := func(what, js string) {
		t.Helper()
		run(what, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(45*time.Second)))
	}

	// The page lists the pipelines with their lag.
	run("load /ui", chromedp.Navigate(base+"/ui"), chromedp.WaitVisible(chromedp.CSS(`#pipelines tr[data-pipeline="billing"]`)))
	for _, name := range []string{"orders", "billing"} {
		poll("lag of "+name, `(() => { const r = document.querySelector('tr[data-pipeline="`+name+`"]');
			return r && r.querySelector('[data-field="lag_seconds"]').textContent !== '—' && r.querySelector('[data-field="lag_bytes"]').textContent !== '—'
				&& r.querySelector('.state').textContent === 'running'; })()`)
	}
	// A clean run: nothing published again, shown as 0.
	for _, name := range []string{"orders", "billing"} {
		if got := text(t, tab, `tr[data-pipeline="`+name+`"] [data-field="republished_total"]`); got != "0" {
			t.Errorf("republished on the page for %s: %q, want 0", name, got)
		}
	}
	t.Logf("lag on the page: orders %s / %s, billing %s / %s",
		text(t, tab, `tr[data-pipeline="orders"] [data-field="lag_seconds"]`), text(t, tab, `tr[data-pipeline="orders"] [data-field="lag_bytes"]`),
		text(t, tab, `tr[data-pipeline="billing"] [data-field="lag_seconds"]`), text(t, tab, `tr[data-pipeline="billing"] [data-field="lag_bytes"]`))

	// Refused: an action from the page's origin without a session, then,
	// signed in, one that carries the cookie but not the CSRF token.
	const pauseByHand = `fetch('/api/v1/pipelines/billing/pause', {method: 'POST', credentials: 'same-origin'}).then(r => String(r.status))`
	if got := eval(pauseByHand); got != "401" {
		t.Errorf("an action without a session or token: %s, want 401", got)
	}
	run("sign in", chromedp.SendKeys(chromedp.CSS("#token"), "console-secret"), chromedp.Click(chromedp.CSS(`#signin button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#signout")))
	if got := eval(`document.cookie`); strings.Contains(got, "outboxrelay_session") {
		t.Errorf("the session cookie is readable by the page's script (not HttpOnly): %q", got)
	}
	if got := eval(pauseByHand); got != "403" {
		t.Errorf("an action with the session cookie but without the CSRF token: %s, want 403", got)
	}
	if got := text(t, tab, `tr[data-pipeline="billing"] .state`); got != "running" {
		t.Fatalf("billing is %s after the refused pauses, want running", got)
	}

	// A dead letter with two messages parked behind it.
	poison := a.insert("outbox", "invoice", "inv-7", 1)
	parked := a.insert("outbox", "invoice", "inv-7", 2)
	waitSQL(t, a, `SELECT (SELECT count(*) FROM outboxrelay.dead_letters) = 1 AND (SELECT count(*) FROM outboxrelay.parked) = 2`, 45*time.Second)
	run("list the dead letters", chromedp.Click(chromedp.CSS("#dl-refresh")), chromedp.WaitVisible(chromedp.CSS(`#letters tr[data-letter]`)))
	run("open the dead letter", chromedp.Click(chromedp.CSS(`#letters tr[data-letter] button`)), chromedp.WaitVisible(chromedp.CSS("#letter")))
	if got := text(t, tab, "#letter-error"); !strings.Contains(got, "TOPIC_AUTHORIZATION_FAILED") {
		t.Errorf("the letter's error on the page: %q", got)
	}
	if got := text(t, tab, "#letter-envelope"); !strings.Contains(got, poison[0]) || !strings.Contains(got, `"payload"`) {
		t.Errorf("the letter's envelope on the page lacks its id or payload: %q", got)
	}
	if got := eval(`String(document.querySelectorAll('#letter-chain tbody tr').length)`); got != "2" {
		t.Errorf("%s parked messages on the page, want 2", got)
	}
	if got := text(t, tab, `#letter-fields`); !strings.Contains(got, "Attempts1") {
		t.Errorf("the letter's fields lack its attempts: %q", got)
	}
	poll("a few chart samples", `document.querySelectorAll('#chart path').length === 2 && document.querySelector('#chart path').getAttribute('d').split('L').length >= 3`)
	shot(t, tab, "console.png", true)

	// On a phone, 400 px wide: every button of the pipelines and of the
	// dead letters is inside the screen, and the page does not scroll
	// sideways.
	run("a 400 px screen", chromedp.EmulateViewport(400, 900))
	narrow := eval(`(() => { const w = document.documentElement.clientWidth;
		const bs = Array.from(document.querySelectorAll('#pipelines button, #letters button'));
		const out = bs.filter((b) => { const r = b.getBoundingClientRect(); return r.width === 0 || r.left < 0 || r.right > w; })
			.map((b) => { const r = b.getBoundingClientRect(); return b.getAttribute('aria-label') + ' at ' + Math.round(r.left) + '..' + Math.round(r.right); });
		return JSON.stringify({buttons: bs.length, width: w, page: document.documentElement.scrollWidth, outside: out}); })()`)
	var layout struct {
		Buttons, Width, Page int
		Outside              []string
	}
	if err := json.Unmarshal([]byte(narrow), &layout); err != nil {
		t.Fatalf("the layout at 400 px: %v: %s", err, narrow)
	}
	shot(t, tab, "console-400px.png", false)
	if layout.Buttons != 3 || len(layout.Outside) != 0 || layout.Page > layout.Width {
		t.Errorf("at 400 px: %d buttons (want 3: pause orders, pause billing, open the letter), outside the %d px screen: %q; the page is %d px wide",
			layout.Buttons, layout.Width, layout.Outside, layout.Page)
	}
	t.Logf("at 400 px: %d buttons, %d outside the screen, the page %d px wide", layout.Buttons, len(layout.Outside), layout.Page)
	run("back to the desktop", chromedp.EmulateViewport(1360, 1000)) // EmulateReset leaves the page 400 px wide
	if w := eval(`String(document.documentElement.clientWidth)`); w == "400" {
		t.Fatalf("the page is still %s px wide after the 400 px check", w)
	}

	// Fix the broker, then replay from the page, confirming first.
	acl.Remove()
	run("replay", chromedp.Click(chromedp.CSS("#letter-replay")), chromedp.WaitVisible(chromedp.CSS("#confirm-ok")))
	shot(t, tab, "console-confirm.png", false)
	run("confirm the replay", chromedp.Click(chromedp.CSS("#confirm-ok")))
	poll("the replay's result", `document.querySelector('#notice').textContent.startsWith('Replayed dead letter')`)
	if got := text(t, tab, "#notice"); !strings.Contains(got, "1 letter and 2 parked published") {
		t.Errorf("the replay's result on the page: %q", got)
	}
	want := append(append([]string{}, poison...), parked...)
	recs := invoices.waitIDs(want, 30*time.Second)
	if order := checkOrder(want, recs); order != 0 {
		t.Errorf("the replayed chain arrived out of order (%d)", order)
	}

	// Pause billing from the page: rows committed meanwhile do not arrive.
	run("pause billing", chromedp.Click(chromedp.CSS(`button[data-key="pause:billing"]`)))
	run("the pause's confirm step", chromedp.WaitVisible(chromedp.CSS("#confirm-ok")))
	run("confirm the pause", chromedp.Click(chromedp.CSS("#confirm-ok")))
	poll("billing paused", `document.querySelector('#notice').textContent === 'Pipeline billing is paused.'`)
	var active bool
	if err := b.db.QueryRow(t.Context(), "SELECT active FROM pg_replication_slots WHERE slot_name = 'console_b'").Scan(&active); err != nil || active {
		t.Fatalf("billing's slot while paused: active %v (%v), want kept and inactive", active, err)
	}
	time.Sleep(300 * time.Millisecond)
	before := len(ordersB.records())
	var whilePaused []string
	for i := range 4 {
		whilePaused = append(whilePaused, b.insert("outbox", "order", fmt.Sprint(i%2), 5)...)
	}
	time.Sleep(2 * time.Second)
	if n := len(ordersB.records()) - before; n != 0 {
		t.Errorf("%d records of billing arrived while it was paused", n)
	}
	// Paused, its slot's retained WAL and lag are what grow: the page
	// shows them (read from PostgreSQL), and its dead letters can be read.
	billing := func(field string) string { return `tr[data-pipeline="billing"] [data-field="` + field + `"]` }
	shortPoll := func(what, js string) { // a failure here does not stop the test: the ones after it tell more
		t.Helper()
		ctx, cancel := context.WithTimeout(tab, 20*time.Second)
		defer cancel()
		if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(12*time.Second))); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	shortPoll("billing's figures while paused", `['lag_seconds', 'lag_bytes', 'retained_wal_bytes'].every((f) =>
		document.querySelector('tr[data-pipeline="billing"] [data-field="' + f + '"]').textContent !== '—')`)
	t.Logf("billing paused: lag %s / %s, retained WAL %s, throughput %s", text(t, tab, billing("lag_seconds")), text(t, tab, billing("lag_bytes")),
		text(t, tab, billing("retained_wal_bytes")), text(t, tab, billing("throughput")))
	eval(`(() => { const s = document.querySelector('#dl-pipeline'); s.value = 'billing'; s.dispatchEvent(new Event('change')); return s.value; })()`)
	shortPoll("billing's dead letters read", `document.querySelector('#letters-empty').textContent.includes('billing')`)
	if got := text(t, tab, "#letters-empty"); got != "No dead letters in pipeline billing." {
		t.Errorf("billing's dead letters while paused: %q", got)
	}
	// Paused for the last samples the throughput looks back on, so that
	// right after the resume it has nothing but paused samples to go by.
	poll("four history samples of billing paused", `fetch('/api/v1/history?pipeline=billing').then((r) => r.json()).then((h) => {
		const s = h.pipelines[0].samples; return s.length >= 4 && s.slice(-4).every((x) => x.state === 'paused'); })`)
	shot(t, tab, "console-paused.png", false)
	run("resume billing", chromedp.Click(chromedp.CSS(`button[data-key="resume:billing"]`)), chromedp.WaitVisible(chromedp.CSS("#confirm-ok")),
		chromedp.Click(chromedp.CSS("#confirm-ok")))
	poll("billing running", `document.querySelector('#notice').textContent === 'Pipeline billing is running.'`)
	poll("billing's row after the resume", `document.querySelector('tr[data-pipeline="billing"] .state').textContent === 'running'`)
	if got := text(t, tab, billing("throughput")); got == "—" {
		t.Errorf("billing's throughput right after the resume: %q, want a rate", got)
	}
	ledgerB = append(ledgerB, whilePaused...)
	recsB := ordersB.waitIDs(ledgerB, 30*time.Second)
	if order := checkOrder(ledgerB, recsB); order != 0 {
		t.Errorf("billing: %d records out of their aggregate's order", order)
	}
	ledgerA = append(ledgerA, a.insert("outbox", "order", "1", 5)...)
	recsA := ordersA.waitIDs(ledgerA, 30*time.Second)
	shot(t, tab, "console-end.png", false)
	p.stop()

	// Audit: the two refusals, the sign-in, the replay, the pause and the
	// resume, each a line.
	var refused401, refused403, ok int
	for _, line := range strings.Split(p.out.String(), "\n") {
		if !strings.Contains(line, `"msg":"audit"`) {
			continue
		}
		switch {
		case strings.Contains(line, `"status":401`):
			refused401++
		case strings.Contains(line, `"status":403`) && strings.Contains(line, "X-CSRF-Token"):
			refused403++
		case strings.Contains(line, `"status":200`) && strings.Contains(line, `"via":"session"`) || strings.Contains(line, `"what":"POST /api/v1/session"`):
			ok++
		}
	}
	if refused401 != 1 || refused403 != 1 || ok != 4 {
		t.Errorf("audit lines: %d refused 401, %d refused 403 for the CSRF token, %d done through the session; want 1, 1 and 4 (sign-in, replay, pause, resume)",
			refused401, refused403, ok)
	}
	t.Logf("console: orders rows %d, billing rows %d (%d committed while paused), lost 0, duplicates %d and %d; dead letter replayed with 2 parked, %d invoice records; audit lines: %d refused 401, %d refused 403, %d done",
		len(ledgerA), len(ledgerB), len(whilePaused), duplicates(recsA), duplicates(recsB), len(recs), refused401, refused403, ok)
}

// text is the text content of the first element sel matches.
func text(t *testing.T, tab context.Context, sel string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
	if err != nil {
		return fmt.Sprintf("(no %s: %v)", sel, err)
	}
	return strings.TrimSpace(v)
}

// shot saves a screenshot of the whole page into the test's artifact dir
// and, for the one the README shows, to $OUTBOXRELAY_CONSOLE_SCREENSHOT.
func shot(t *testing.T, tab context.Context, name string, readme bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(t.ArtifactDir(), name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s (%d bytes)", path, len(png))
	if dest := os.Getenv("OUTBOXRELAY_CONSOLE_SCREENSHOT"); readme && dest != "" {
		if err := os.WriteFile(dest, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// waitSQL waits until the query, on e's database, answers true.
func waitSQL(t *testing.T, e *env, query string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var ok bool
		if err := e.db.QueryRow(t.Context(), query).Scan(&ok); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not true within %s: %s", timeout, query)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
