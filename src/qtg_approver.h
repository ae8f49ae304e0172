/* qtg_approver.h -- `qtgd approver`: an approver's Ed25519 key and the
 * signature of an approval statement (qtg_approvers.h), on the approver's
 * own machine. */
#ifndef QTG_APPROVER_H
#define QTG_APPROVER_H

/* argv holds the command's arguments (argv[0] = key|public|sign); returns
 * the exit code. */
int qtg_approver_main(int argc, char **argv);

#endif
