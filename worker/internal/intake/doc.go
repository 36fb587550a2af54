// Package intake is how run requests come in to a worker: the pull
// requests that fetch them from a queue's consumer (pull.go), the slim
// acknowledgements a run keeps instead of its request (requestack.go),
// and what lets a first attempt skip a read at pickup: the record read
// (recordread.go) and the control read (coverage.go).
package intake
