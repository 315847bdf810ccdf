package atomicfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockPoll is how often Lock retries a held lock; polling (rather than a
// blocking flock) lets a cancelled context, such as SIGTERM, end the wait.
const lockPoll = 5 * time.Millisecond

// Lock takes an exclusive advisory lock (flock) for editing path and returns
// its release. The lock is on path's directory (after symbolic links): the
// file itself is replaced by a rename on every write, so a lock on its inode
// would not exclude a writer that opened the new file, and a sibling lock
// file would be debris in the user's repository. Every budgetgen edit of a
// file in that directory holds it; read the file after Lock returns, so the
// edit starts from the last committed content. Lock waits until ctx is done.
func Lock(ctx context.Context, path string) (unlock func(), err error) {
	if target, err := filepath.EvalSymlinks(path); err == nil {
		path = target
	}
	dir := filepath.Dir(path)
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	for {
		err := syscall.Flock(int(d.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(d.Fd()), syscall.LOCK_UN)
				_ = d.Close() // closing also releases the lock; nothing was written
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = d.Close() // read-only handle of a lock we did not get
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			_ = d.Close() // read-only handle of a lock we did not get
			return nil, fmt.Errorf("lock %s: %w", path, context.Cause(ctx))
		case <-time.After(lockPoll):
		}
	}
}
