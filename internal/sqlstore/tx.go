package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/plugbus/plugbus/bus"
)

// Tx is a transaction of a [Store] in progress, carried in a context. The
// outbox and inbox plugins open one per handler; the handler reads it with
// outbox.Tx(ctx) to write its own data in it.
//
// Tx is a [bus.Outbox]: messages added to it are stored in the outbox
// table within the transaction and dispatched by the relay once it commits.
type Tx struct {
	store *Store
	sqlTx *sql.Tx

	mu             sync.Mutex // guards sqlTx's use, storedMessages and carriesOutbox
	storedMessages bool       // since the last commit: the relays are woken
	carriesOutbox  bool
}

type txKey struct{}

// TxFrom returns the store transaction carried by ctx, or nil.
func TxFrom(ctx context.Context) *Tx {
	t, _ := ctx.Value(txKey{}).(*Tx)
	return t
}

// SQL returns the database transaction.
func (t *Tx) SQL() *sql.Tx { return t.sqlTx }

// InTx runs fn in a transaction of s. When ctx already carries a
// transaction of s, fn joins it and the caller that opened it commits;
// otherwise InTx begins one, passes it to fn in ctx, commits when fn
// returns nil and rolls back when fn returns an error or panics.
//
// A commit that stored outgoing messages wakes the relays of this process
// and, on PostgreSQL, of every process (NOTIFY).
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) error {
	if t := TxFrom(ctx); t != nil && t.store == s {
		return fn(ctx, t)
	}
	sqlTx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: beginning a transaction: %w", err)
	}
	t := &Tx{store: s, sqlTx: sqlTx}
	done := false
	defer func() {
		if !done {
			_ = sqlTx.Rollback()
		}
	}()
	if err := fn(context.WithValue(ctx, txKey{}, t), t); err != nil {
		return err
	}
	t.mu.Lock()
	stored := t.storedMessages
	t.storedMessages = false
	t.mu.Unlock()
	if stored && s.dialect.rowLocks() {
		if _, err := sqlTx.ExecContext(ctx, s.queries.notify, s.Channel()); err != nil {
			return fmt.Errorf("store: notifying the outbox relays: %w", err)
		}
	}
	done = true
	if err := sqlTx.Commit(); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	if stored {
		s.Wake()
	}
	return nil
}

// withinSavepoint is the savepoint of [Store.InTxUndoable] in a joined
// transaction. One name serves nested calls: ROLLBACK TO and RELEASE act
// on the most recent savepoint of a name.
const withinSavepoint = "plugbus_within"

// InTxUndoable is [Store.InTx], except that when fn joins the transaction
// ctx carries, what fn did is undone (to a savepoint) when it returns an
// error or panics: a caller that goes on past fn's error keeps nothing of
// fn, as when fn runs in a transaction of its own. outbox.Within runs on it.
func (s *Store) InTxUndoable(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) (err error) {
	t := TxFrom(ctx)
	if t == nil || t.store != s {
		return s.InTx(ctx, fn)
	}
	if err := t.Savepoint(ctx, withinSavepoint); err != nil {
		return err
	}
	// fn's error may be its context's end: undo it all the same.
	uctx := context.WithoutCancel(ctx)
	ok := false
	defer func() {
		if !ok {
			if rerr := t.RollbackTo(uctx, withinSavepoint); rerr != nil {
				err = errors.Join(err, rerr)
				return
			}
			if rerr := t.Release(uctx, withinSavepoint); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	if err := fn(ctx, t); err != nil {
		return err
	}
	ok = true
	return t.Release(uctx, withinSavepoint)
}

// SetCarriesOutbox records that the messages the handler running in t
// sends are stored in t: the outbox plugin calls it after
// [bus.Handling.UseOutbox]. The inbox plugin then records the handler as
// done in t, since its sends commit with the record.
func (t *Tx) SetCarriesOutbox() {
	t.mu.Lock()
	t.carriesOutbox = true
	t.mu.Unlock()
}

// CarriesOutbox reports whether [Tx.SetCarriesOutbox] was called on t.
func (t *Tx) CarriesOutbox() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.carriesOutbox
}

// Add stores m in the outbox table within the transaction. It implements
// [bus.Outbox]: the outbox plugin hands the transaction to the handler
// stage with [bus.Handling.UseOutbox].
func (t *Tx) Add(ctx context.Context, m bus.Outbound) error {
	row, err := encodeOutbound(m)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, err := t.sqlTx.ExecContext(ctx, t.store.queries.insertOutbox, row...); err != nil {
		return fmt.Errorf("store: storing %s (id %s) in the outbox: %w", m.Envelope.Name, m.Envelope.Attributes.MessageID, err)
	}
	t.storedMessages = true
	return nil
}

var _ bus.Outbox = (*Tx)(nil)
