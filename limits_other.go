//go:build !linux

package main

// openFilesLimit is a conservative guess where it is not read.
func openFilesLimit() uint64 { return 1024 }

// memoryLimit is 0, no limit, where cgroups are not read.
func memoryLimit() uint64 { return 0 }
