// Package ledger is the inbox tests' non-idempotent side effect and its
// check: each handler run adds an amount to an account's balance and writes
// one ledger row, so a second run of a message is visible as a second row
// and a wrong balance. Check compares the database with the messages sent.
package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tables creates the accounts and the ledger.
const Tables = `CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
CREATE TABLE ledger (
	run        bigserial PRIMARY KEY,
	message_id text   NOT NULL,
	account    text   NOT NULL,
	seq        int    NOT NULL,
	amount     bigint NOT NULL
);`

// Msg is one test message: the seq-th deposit of amount into account.
type Msg struct {
	ID      string
	Account string
	Seq     int
	Amount  int64
	// Poison makes Apply fail while the test says poison fails.
	Poison bool
}

// Generate returns n messages spread round-robin over accounts accounts,
// seq counting per account from 1, amounts 1 to 97.
func Generate(n, accounts int) []Msg {
	msgs := make([]Msg, n)
	seq := make(map[string]int)
	for i := range msgs {
		acct := fmt.Sprintf("acct-%03d", i%accounts)
		seq[acct]++
		msgs[i] = Msg{ID: newID(), Account: acct, Seq: seq[acct], Amount: int64(1 + i%97)}
	}
	return msgs
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Envelope is m as the relay's envelope (format envelope); the record key
// is m.Account.
func (m Msg) Envelope() []byte {
	p, _ := json.Marshal(payload{Account: m.Account, Seq: m.Seq, Amount: m.Amount, Poison: m.Poison}) // plain fields: never fails
	return fmt.Appendf(nil, `{"envelope_version":1,"message_id":%q,"event_type":"deposit","schema_version":1,"aggregate_type":"account","aggregate_id":%q,"occurred_at":%q,"headers":{},"source":{"database":"bank","table":"public.outbox","lsn":"0/1","commit_lsn":"0/2","xid":1,"committed_at":%q},"payload":%s}`,
		m.ID, m.Account, time.Now().UTC().Format(time.RFC3339Nano), time.Now().UTC().Format(time.RFC3339Nano), p)
}

type payload struct {
	Account string `json:"account"`
	Seq     int    `json:"seq"`
	Amount  int64  `json:"amount"`
	Poison  bool   `json:"poison,omitempty"`
}

// ErrPoison is what Apply returns for a poison message while poisoned.
var ErrPoison = errors.New("poison message: the handler cannot process it")

// Apply is the handler's work for a message with id and body p (the
// envelope's payload): a balance update and a ledger row in tx.
func Apply(ctx context.Context, tx pgx.Tx, id string, p []byte, poisoned bool) error {
	var d payload
	if err := json.Unmarshal(p, &d); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	if d.Poison && poisoned {
		return ErrPoison
	}
	if _, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + $1 WHERE id = $2", d.Amount, d.Account); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, "INSERT INTO ledger (message_id, account, seq, amount) VALUES ($1, $2, $3, $4)", id, d.Account, d.Seq, d.Amount)
	return err
}

// Querier is a pool or a connection.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Setup creates the tables and an account, balance 0, for each account of
// msgs.
func Setup(ctx context.Context, db Querier, msgs []Msg) error {
	if _, err := db.Exec(ctx, Tables); err != nil {
		return fmt.Errorf("create the ledger: %w", err)
	}
	seen := map[string]bool{}
	for _, m := range msgs {
		if !seen[m.Account] {
			seen[m.Account] = true
			if _, err := db.Exec(ctx, "INSERT INTO accounts (id) VALUES ($1)", m.Account); err != nil {
				return fmt.Errorf("create account: %w", err)
			}
		}
	}
	return nil
}

// Report is what Check found.
type Report struct {
	Messages   int // messages sent
	Runs       int // ledger rows: committed handler runs
	Doubles    int // runs beyond the first of a message
	Missing    int // messages without a run
	OutOfOrder int // runs of an account whose seq is not the next one
	// BadBalances counts accounts whose balance is not the sum of their
	// messages' amounts.
	BadBalances int
}

// ExactlyOnce reports whether every message's effect is applied exactly
// once, in per-account order, with the right balances.
func (r Report) ExactlyOnce() bool {
	return r.Doubles == 0 && r.Missing == 0 && r.OutOfOrder == 0 && r.BadBalances == 0 && r.Runs == r.Messages
}

func (r Report) String() string {
	return fmt.Sprintf("messages %d, handler runs %d, double effects %d, missing %d, out of order %d, wrong balances %d",
		r.Messages, r.Runs, r.Doubles, r.Missing, r.OutOfOrder, r.BadBalances)
}

// Check compares the ledger and the balances with msgs.
func Check(ctx context.Context, db Querier, msgs []Msg) (Report, error) {
	r := Report{Messages: len(msgs)}
	rows, err := db.Query(ctx, "SELECT message_id, account, seq FROM ledger ORDER BY run")
	if err != nil {
		return r, fmt.Errorf("read the ledger: %w", err)
	}
	runs := map[string]int{}
	last := map[string]int{}
	for rows.Next() {
		var id, acct string
		var seq int
		if err := rows.Scan(&id, &acct, &seq); err != nil {
			rows.Close()
			return r, err
		}
		r.Runs++
		runs[id]++
		if runs[id] > 1 {
			r.Doubles++
			continue
		}
		if seq != last[acct]+1 {
			r.OutOfOrder++
		}
		last[acct] = seq
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("read the ledger: %w", err)
	}
	want := map[string]int64{}
	for _, m := range msgs {
		want[m.Account] += m.Amount
		if runs[m.ID] == 0 {
			r.Missing++
		}
	}
	rows, err = db.Query(ctx, "SELECT id, balance FROM accounts")
	if err != nil {
		return r, fmt.Errorf("read the balances: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var acct string
		var bal int64
		if err := rows.Scan(&acct, &bal); err != nil {
			return r, err
		}
		if bal != want[acct] {
			r.BadBalances++
		}
	}
	return r, rows.Err()
}
