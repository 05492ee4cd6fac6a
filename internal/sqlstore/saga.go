package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// SagaRow is the stored state of one saga instance.
type SagaRow struct {
	InstanceID string // unique per instance: a re-created instance gets a new one
	Version    int64  // incremented by every update; the optimistic lock
	State      []byte // the encoded state
	Completed  bool   // completed and kept for the retention
}

// sagaQueries is the SQL of the saga table.
type sagaQueries struct {
	load, insert, update, delete, purge, active string
}

func buildSagaQueries(d Dialect, st Table) (stmts []ddl, q sagaQueries) {
	t := st.quoted()
	stmts = []ddl{
		{t, `CREATE TABLE IF NOT EXISTS ` + t + ` (
	saga TEXT NOT NULL,
	correlation TEXT NOT NULL,
	instance_id TEXT NOT NULL,
	version BIGINT NOT NULL,
	state ` + d.blobType() + ` NOT NULL,
	created_at BIGINT NOT NULL,
	updated_at BIGINT NOT NULL,
	completed_at BIGINT,
	PRIMARY KEY (saga, correlation)
)`},
		{indexObject(st, st.Name+"_completed"), `CREATE INDEX IF NOT EXISTS "` + st.Name + `_completed" ON ` + t + ` (saga, completed_at) WHERE completed_at IS NOT NULL`},
	}
	q = sagaQueries{
		load:   `SELECT instance_id, version, state, completed_at IS NOT NULL FROM ` + t + ` WHERE saga = ? AND correlation = ?`,
		insert: `INSERT INTO ` + t + ` (saga, correlation, instance_id, version, state, created_at, updated_at, completed_at) VALUES (?, ?, ?, 1, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		update: `UPDATE ` + t + ` SET version = version + 1, state = ?, updated_at = ?, completed_at = ? WHERE saga = ? AND correlation = ? AND instance_id = ? AND version = ?`,
		delete: `DELETE FROM ` + t + ` WHERE saga = ? AND correlation = ? AND instance_id = ? AND version = ?`,
		purge:  `DELETE FROM ` + t + ` WHERE saga = ? AND completed_at IS NOT NULL AND completed_at < ?`,
		active: `SELECT count(*) FROM ` + t + ` WHERE saga = ? AND completed_at IS NULL`,
	}
	for _, p := range []*string{&q.load, &q.insert, &q.update, &q.delete, &q.purge, &q.active} {
		*p = d.Rebind(*p)
	}
	return stmts, q
}

// SagaTable returns the saga table's name.
func (s *Store) SagaTable() string { return s.saga.String() }

// LoadSaga reads, within tx, the instance of saga whose correlation value
// is key. found is false when there is none.
func (s *Store) LoadSaga(ctx context.Context, tx *Tx, saga, key string) (row SagaRow, found bool, err error) {
	tx.mu.Lock()
	err = tx.sqlTx.QueryRowContext(ctx, s.sagaQ.load, saga, key).Scan(&row.InstanceID, &row.Version, &row.State, &row.Completed)
	tx.mu.Unlock()
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return SagaRow{}, false, nil
	case err != nil:
		return SagaRow{}, false, fmt.Errorf("store: loading saga %s instance %q: %w", saga, key, err)
	}
	return row, true, nil
}

// SaveSaga writes, within tx, the instance of saga whose correlation value
// is key: it inserts it when prev is nil, otherwise it updates it if it is
// still the instance prev (its instance id) at prev.Version; with remove
// set it deletes it instead. It returns false when another transaction
// inserted, updated or replaced the instance first (an optimistic
// concurrency conflict): tx must not commit what it did for this
// instance, and the message is handled again. A version alone does not
// tell instances apart: every instance starts at 1.
func (s *Store) SaveSaga(ctx context.Context, tx *Tx, saga, key string, prev *SagaRow, next SagaRow, remove bool) (bool, error) {
	now := time.Now().UnixNano()
	var completedAt any
	if next.Completed {
		completedAt = now
	}
	var (
		res sql.Result
		err error
	)
	tx.mu.Lock()
	switch {
	case prev == nil && remove:
		// Started and completed by one message: nothing to keep, but
		// another transaction may have created the instance since tx
		// looked. Inserting it (and deleting it at once) finds that out
		// as for any new instance: on PostgreSQL the insert waits for
		// the other transaction and then conflicts.
		res, err = tx.sqlTx.ExecContext(ctx, s.sagaQ.insert, saga, key, next.InstanceID, next.State, now, now, completedAt)
		if err == nil {
			var n int64
			if n, err = res.RowsAffected(); err == nil && n == 1 {
				res, err = tx.sqlTx.ExecContext(ctx, s.sagaQ.delete, saga, key, next.InstanceID, int64(1))
			}
		}
	case prev == nil:
		res, err = tx.sqlTx.ExecContext(ctx, s.sagaQ.insert, saga, key, next.InstanceID, next.State, now, now, completedAt)
	case remove:
		res, err = tx.sqlTx.ExecContext(ctx, s.sagaQ.delete, saga, key, prev.InstanceID, prev.Version)
	default:
		res, err = tx.sqlTx.ExecContext(ctx, s.sagaQ.update, next.State, now, completedAt, saga, key, prev.InstanceID, prev.Version)
	}
	tx.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("store: saving saga %s instance %q: %w", saga, key, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store: saving saga %s instance %q: %w", saga, key, err)
	}
	return n == 1, nil
}

// Savepoint marks a point in tx that [Tx.RollbackTo] returns to.
func (t *Tx) Savepoint(ctx context.Context, name string) error {
	return t.exec(ctx, "SAVEPOINT "+name)
}

// RollbackTo undoes what tx did since [Tx.Savepoint] of name, messages
// stored in the outbox included, and keeps the savepoint.
func (t *Tx) RollbackTo(ctx context.Context, name string) error {
	return t.exec(ctx, "ROLLBACK TO SAVEPOINT "+name)
}

// Release forgets the savepoint name, keeping what was done since.
func (t *Tx) Release(ctx context.Context, name string) error {
	return t.exec(ctx, "RELEASE SAVEPOINT "+name)
}

func (t *Tx) exec(ctx context.Context, stmt string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, err := t.sqlTx.ExecContext(ctx, stmt); err != nil {
		return fmt.Errorf("store: %s: %w", stmt, err)
	}
	return nil
}

// PurgeCompletedSagas deletes the instances of saga completed before
// before, and returns how many it deleted.
func (s *Store) PurgeCompletedSagas(ctx context.Context, saga string, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.sagaQ.purge, saga, before.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("store: purging completed instances of saga %s: %w", saga, err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// ActiveSagas returns how many instances of saga are running (not
// completed).
func (s *Store) ActiveSagas(ctx context.Context, saga string) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, s.sagaQ.active, saga).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: counting active instances of saga %s: %w", saga, err)
	}
	return n, nil
}
