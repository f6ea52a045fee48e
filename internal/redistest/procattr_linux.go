package redistest

import "syscall"

// sysProcAttr asks the kernel to kill redis-server when the test binary dies
// (a panic, a -timeout), so that no server outlives its test process.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
